"""toolkit.formats: each format's limits against the IEEE / FP8-paper formulas and published
values, what a cast keeps (checked by casting), the spacing that swallows small updates, the
fate of a sample of magnitudes, and sums rounded at every addition."""

from __future__ import annotations

import math

import pytest
import torch

from toolkit import formats as F

# Published limits: IEEE 754 (fp32, fp16), bf16 = fp32's exponent with 7 fraction bits
# (Kalamkar et al. 2019), FP8 (Micikevicius et al., "FP8 Formats for Deep Learning", 2022,
# Table 1): (exponent bits, mantissa bits, largest value).
PUBLISHED = {"fp32": (8, 23, (2 - 2 ** -23) * 2 ** 127), "fp16": (5, 10, 65504.0),
             "bf16": (8, 7, (2 - 2 ** -7) * 2 ** 127), "fp8 e4m3": (4, 3, 448.0),
             "fp8 e5m2": (5, 2, 57344.0)}


@pytest.mark.parametrize("name", list(F.FORMATS))
def test_limits_follow_the_formulas_and_published_values(name):
    f = F.format_info(name)
    e, m, largest = PUBLISHED[name]
    assert (f.exponent_bits, f.mantissa_bits, f.max) == (e, m, largest)
    assert f.bits == 1 + e + m and f.bytes == f.bits // 8
    # e4m3 ("fn") gives up infinities to extend the top binade, not the bottom: same formula.
    assert f.smallest_normal == 2.0 ** (2 - 2 ** (e - 1))
    assert f.smallest_subnormal == f.smallest_normal * 2.0 ** -m
    assert f.eps == 2.0 ** -m
    assert f.has_inf == (name != "fp8 e4m3")


def test_fp8_table_1_subnormals():
    assert F.format_info("fp8 e4m3").smallest_subnormal == 2.0 ** -9
    assert F.format_info("fp8 e5m2").smallest_subnormal == 2.0 ** -16


@pytest.mark.parametrize("name", list(F.FORMATS))
def test_cast_keeps_the_smallest_subnormal_and_loses_half_of_it(name):
    f = F.format_info(name)
    x = torch.tensor([f.smallest_subnormal, f.smallest_subnormal / 2, f.smallest_subnormal * 0.51],
                     dtype=torch.float64)
    kept = F.cast(x, name)
    # Half of the smallest subnormal is a tie and rounds to the even neighbour, zero.
    assert kept.tolist() == [f.smallest_subnormal, 0.0, f.smallest_subnormal]


def test_what_a_gradient_of_1e_minus_8_becomes():
    got = {n: F.cast(torch.tensor([1e-8], dtype=torch.float64), n).item() for n in F.FORMATS}
    assert got["fp16"] == got["fp8 e4m3"] == got["fp8 e5m2"] == 0.0
    assert abs(got["bf16"] - 1e-8) / 1e-8 < 2 ** -8      # kept, to 8 significant bits
    assert abs(got["fp32"] - 1e-8) / 1e-8 < 2 ** -24


@pytest.mark.parametrize("name", ["fp32", "fp16", "bf16", "fp8 e5m2"])
@pytest.mark.parametrize("w", [1.0, 3.0, 0.02, 1000.0])
def test_an_update_below_half_an_ulp_is_lost(name, w):
    f = F.format_info(name)
    if not f.smallest_normal <= w <= f.max / 2:
        pytest.skip("outside the format's normal range")
    base = F.cast(torch.tensor([w], dtype=torch.float64), name).item()  # w as the format holds it
    u = F.ulp(base, name)
    up = lambda d: F.cast(torch.tensor([base + d], dtype=torch.float64), name).item()  # noqa
    assert up(0.49 * u) == base and up(0.51 * u) == base + u


def test_ulp_examples():
    assert F.ulp(1.0, "bf16") == 2 ** -7 and F.ulp(1.0, "fp16") == 2 ** -10
    assert F.ulp(65504.0, "fp16") == 32.0
    assert F.ulp(1e-9, "fp16") == F.format_info("fp16").smallest_subnormal
    with pytest.raises(ValueError, match="finite"):
        F.ulp(math.inf, "fp16")


@pytest.mark.parametrize("name", ["fp16", "bf16", "fp8 e5m2"])
def test_survival_fractions_agree_with_casting(name):
    gen = torch.Generator().manual_seed(0)
    f = F.format_info(name)
    lo, hi = math.log2(f.smallest_subnormal) - 4, min(math.log2(f.max) + 3, 140)
    x = 2.0 ** (lo + (hi - lo) * torch.rand(20_000, generator=gen, dtype=torch.float64))
    share = F.survival(x, name)
    cast = F.cast(x, name)
    assert sum(share.values()) == pytest.approx(1.0)
    assert share["zero"] == pytest.approx((cast == 0).double().mean().item(), abs=1e-12)
    assert share["overflow"] == pytest.approx(torch.isinf(cast).double().mean().item(),
                                              abs=1e-12)
    assert share["subnormal"] == pytest.approx(
        ((cast > 0) & (cast < f.smallest_normal)).double().mean().item(), abs=1e-12)
    assert min(share.values()) > 0  # the sample spans every band


def test_survival_counts_exact_zeros_as_kept_and_rejects_empty():
    assert F.survival(torch.zeros(4), "fp16")["normal"] == 1.0
    with pytest.raises(ValueError, match="empty"):
        F.survival(torch.zeros(0), "fp16")


def test_sequential_sum_stalls_in_16_bits():
    ones = torch.ones(1000, dtype=torch.float64)
    assert F.sequential_sum(ones, torch.bfloat16).item() == 256.0    # 256 + 1 rounds to 256
    assert F.sequential_sum(torch.ones(3000), torch.float16).item() == 2048.0
    assert F.sequential_sum(ones, torch.float32).item() == 1000.0


def test_sequential_sum_rounds_after_every_addition():
    gen = torch.Generator().manual_seed(1)
    values = torch.randn(64, 300, generator=gen, dtype=torch.float64)
    got = F.sequential_sum(values, torch.bfloat16)
    acc = values[0].to(torch.bfloat16)
    for v in values[1:]:
        acc = (acc.double() + v.to(torch.bfloat16).double()).to(torch.bfloat16)
    assert torch.equal(got, acc.double())
    assert torch.allclose(F.sequential_sum(values, torch.float64), values.sum(0))


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="format must be one of"):
        F.format_info("fp4")
    with pytest.raises(ValueError, match="first dimension"):
        F.sequential_sum(torch.tensor(1.0), torch.bfloat16)
    with pytest.raises(ValueError, match="floating dtype"):
        F.sequential_sum(torch.ones(3), torch.int32)


def test_byte_units_are_binary_and_labelled_so():
    # The course's convention (module docstring): KiB = 2**10 bytes, and the label says so.
    assert [F.human_bytes(n) for n in (0, 512, 4096, 4000, 1.5 * 2**20, 2**30, 5 * 2**40)] == [
        "0 B", "512 B", "4 KiB", "3.91 KiB", "1.5 MiB", "1 GiB", "5 TiB"]
    assert F.byte_unit(1023) == ("B", 1) and F.byte_unit(1024) == ("KiB", 1024)
    assert F.byte_unit(80 * 2**30) == ("GiB", 2**30) and F.byte_unit(-3 * 2**20)[0] == "MiB"
    with pytest.raises(ValueError, match="nbytes must be a number"):
        F.byte_unit(float("nan"))
