"""toolkit.precision.accumulate: rounding to m fraction bits equals torch's casts where the formats
agree, TF32 keeps 10 bits, and an accumulator of m bits behaves as the arithmetic says (a sum of
ones stalls at 2^(m+1), promotion every N_C restores fp32-like error, truncation is biased)."""

from __future__ import annotations

import pytest
import torch

from toolkit.precision import accumulate as A


@pytest.mark.parametrize("bits,dtype", [(7, torch.bfloat16), (23, torch.float32)])
def test_round_to_bits_is_the_cast_of_formats_with_fp32s_exponent(bits, dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5000, generator=gen, dtype=torch.float64) * 10.0 ** torch.randint(
        -20, 20, (5000,), generator=gen)
    assert torch.equal(A.round_to_bits(x, bits), x.to(dtype).double())


def test_round_to_bits_matches_fp16_and_e4m3_in_their_normal_ranges():
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(5000, generator=gen, dtype=torch.float64) * 400 + 0.02   # e4m3 normals
    assert torch.equal(A.round_to_bits(x, 3), x.to(torch.float8_e4m3fn).double())
    assert torch.equal(A.round_to_bits(x, 10), x.to(torch.float16).double())


def test_truncation_rounds_toward_zero_and_specials_pass():
    x = torch.tensor([1.0 + 2 ** -8 + 2 ** -9, -(1.0 + 2 ** -8 + 2 ** -9), 0.0,
                      float("inf"), float("nan")], dtype=torch.float64)
    t = A.round_to_bits(x, 7, mode="toward_zero")
    assert t[0].item() == 1.0 and t[1].item() == -1.0 and t[2].item() == 0.0
    assert torch.isinf(t[3]) and torch.isnan(t[4])
    assert A.round_to_bits(x[:1], 7).item() == 1.0 + 2 ** -7       # nearest goes up
    with pytest.raises(ValueError, match="bits"):
        A.round_to_bits(x, 60)
    with pytest.raises(ValueError, match="mode"):
        A.round_to_bits(x, 7, mode="up")


def test_tf32_keeps_ten_fraction_bits():
    x = torch.tensor([1.0 + 2 ** -10 + 2 ** -12, 3.0 + 2 ** -12])
    assert A.tf32(x).tolist() == [1.0 + 2 ** -10, 3.0]
    assert A.tf32(x).dtype == torch.float32


def test_a_sum_of_ones_stalls_where_the_accumulator_runs_out_of_bits():
    ones_a, ones_b = torch.ones(1, 1000), torch.ones(1000, 1)
    # bf16 (7 bits): 256 + 1 is a tie between 256 and 258, which goes to the even 256.
    assert A.accumulated_matmul(ones_a, ones_b, bits=7).item() == 256
    assert A.accumulated_matmul(ones_a, ones_b, bits=23).item() == 1000
    # Promoted every 128 terms: each partial sum of 128 is exact in 7 bits, their sum in fp32.
    assert A.accumulated_matmul(ones_a, ones_b, bits=7, promote_every=128).item() == 1000


def test_promotion_and_fp32_accumulation_beat_a_long_narrow_sum():
    gen = torch.Generator().manual_seed(2)
    a = torch.randn(8, 2048, generator=gen).to(torch.float8_e4m3fn).float()
    b = torch.randn(2048, 8, generator=gen).to(torch.float8_e4m3fn).float()
    exact = a.double() @ b.double()
    err = {name: A.relative_error(A.accumulated_matmul(a, b, **kw), exact) for name, kw in {
        "bf16": dict(bits=7), "14 bits": dict(bits=13),
        "14 bits, truncated": dict(bits=13, mode="toward_zero"),
        "14 bits, promoted": dict(bits=13, promote_every=128), "fp32": dict(bits=23)}.items()}
    assert err["fp32"] < 1e-6 < err["14 bits, promoted"] < err["14 bits"] < err["bf16"]
    assert err["14 bits, truncated"] > 3 * err["14 bits"]         # a biased error adds up
    assert A.relative_error(exact, exact) == 0


def test_shapes_are_checked():
    with pytest.raises(ValueError, match=r"a \(M, K\) and b \(K, N\)"):
        A.accumulated_matmul(torch.ones(2, 3), torch.ones(4, 2), bits=7)
    with pytest.raises(ValueError, match="promote_every"):
        A.accumulated_matmul(torch.ones(2, 3), torch.ones(3, 2), bits=7, promote_every=0)
