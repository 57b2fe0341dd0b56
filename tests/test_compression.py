"""Compressors, error feedback, byte formulas and the noise scale, in one process.

QSGD (Alistarh et al. 2017, Lemma 3.1): unbiased in expectation over seeds, variance within
min(d/s², √d/s)·‖v‖²; block quantization within half a step; top-k's error feedback exact to
the bit; the wire formats round-trip; the bytes of `toolkit.cost.compression` against payloads
built by the compressors; McCandlish et al.'s estimator recovering |G|² and tr(Σ).
"""

from __future__ import annotations

import math

import pytest
import torch

from toolkit.cost.compression import (
    block_quantized_bytes, code_bits, onebit_allreduce_bytes, onebit_chunk, qsgd_bytes,
    qsgd_variance_bound, sign_bytes, topk_bytes, topk_count, zeropp_volume,
)
from toolkit.cost.critical_batch import noise_scale, steps_and_examples
from toolkit.data_parallel.quantize import (
    ErrorFeedback, block_dequantize, block_quantize, from_payload, pack_int4, pack_signs,
    qsgd_dequantize, qsgd_quantize, sign_compress, sign_decompress, to_payload, topk_compress,
    topk_decompress, unpack_int4, unpack_signs,
)


def _vector(n=1000, seed=0):
    return torch.randn(n, generator=torch.Generator().manual_seed(seed)) * torch.linspace(0.1, 3, n)


@pytest.mark.parametrize("levels", [1, 4, 15])
def test_qsgd_is_unbiased_in_expectation_over_seeds(levels):
    v, block, draws = _vector(300), 100, 4000
    total = torch.zeros_like(v, dtype=torch.float64)
    for seed in range(draws):
        codes, norms = qsgd_quantize(v, levels=levels, block=block,
                                     generator=torch.Generator().manual_seed(seed))
        total += qsgd_dequantize(codes, norms, levels=levels, block=block).double()
    mean = total / draws
    # Each draw is within one level, ‖v_block‖/s, of vᵢ: standard deviation ≤ half of that.
    step = torch.stack([v[i: i + block].norm() for i in range(0, 300, block)]) / levels
    tolerance = 5 * (step / 2).repeat_interleave(block) / math.sqrt(draws)
    assert ((mean - v.double()).abs() <= tolerance.double()).all()
    # ... while one draw is not v (the quantizer does round)
    codes, norms = qsgd_quantize(v, levels=levels, block=block,
                                 generator=torch.Generator().manual_seed(0))
    assert not torch.allclose(qsgd_dequantize(codes, norms, levels=levels, block=block), v)


@pytest.mark.parametrize("levels,block", [(1, 64), (4, 256), (16, 16)])
def test_qsgd_variance_within_lemma_3_1(levels, block):
    v = _vector(block, seed=3)
    errs = []
    for seed in range(500):
        codes, norms = qsgd_quantize(v, levels=levels, block=block,
                                     generator=torch.Generator().manual_seed(seed))
        errs.append(float((qsgd_dequantize(codes, norms, levels=levels, block=block) - v)
                          .pow(2).sum()))
    ratio = sum(errs) / len(errs) / float(v.pow(2).sum())
    assert 0 < ratio <= qsgd_variance_bound(block, levels)
    assert qsgd_variance_bound(block, levels) == min(block / levels**2, math.sqrt(block) / levels)


def test_qsgd_codes_and_the_zero_vector():
    codes, norms = qsgd_quantize(_vector(70), levels=7, block=32,
                                 generator=torch.Generator().manual_seed(1))
    assert codes.dtype == torch.int8 and codes.abs().max() <= 7 and norms.shape == (3,)
    codes, norms = qsgd_quantize(torch.zeros(10), levels=3, block=4)
    assert (qsgd_dequantize(codes, norms, levels=3, block=4) == 0).all()


@pytest.mark.parametrize("bits", [4, 8])
def test_block_quantization_is_within_half_a_step(bits):
    x = _vector(1001, seed=2)
    codes, scales = block_quantize(x, bits=bits, block=128)
    top = 2 ** (bits - 1) - 1
    assert codes.abs().max() == top and scales.shape == (8,)
    err = (block_dequantize(codes, scales, block=128) - x).abs()
    half = (scales / 2).repeat_interleave(128)[:1001]
    assert (err <= half * (1 + 1e-5)).all()


def test_wire_formats_round_trip():
    codes = torch.randint(-8, 8, (11,), dtype=torch.int8)
    assert pack_int4(codes).numel() == 6 and torch.equal(unpack_int4(pack_int4(codes), 11), codes)
    x = _vector(13)
    assert pack_signs(x).numel() == 2
    assert torch.equal(unpack_signs(pack_signs(x), 13), torch.where(x >= 0, 1.0, -1.0))
    a, b = torch.randn(3), torch.arange(5, dtype=torch.int32)
    payload = to_payload(a, b)
    assert payload.dtype == torch.uint8 and payload.numel() == 32
    back = from_payload(payload, [(torch.float32, 3), (torch.int32, 5)])
    assert torch.equal(back[0], a) and torch.equal(back[1], b)
    with pytest.raises(ValueError, match="cover 12 bytes of a 32-byte"):
        from_payload(payload, [(torch.float32, 3)])


def test_scaled_sign_uses_the_mean_magnitude_per_block():
    x = torch.tensor([1.0, -3.0, 2.0, -2.0, 5.0])
    packed, scale = sign_compress(x)
    assert torch.allclose(scale, torch.tensor([2.6]))
    assert torch.allclose(sign_decompress(packed, scale, 5), 2.6 * torch.sign(x))
    packed, scales = sign_compress(x, block=2)
    assert torch.allclose(scales, torch.tensor([2.0, 2.0, 5.0]))   # the short block: its own mean
    assert torch.allclose(sign_decompress(packed, scales, 5, block=2),
                          torch.tensor([2.0, -2.0, 2.0, -2.0, 5.0]))


def test_topk_keeps_the_largest_and_error_feedback_is_exact_to_the_bit():
    memory, applied_total, grad_total = ErrorFeedback(), torch.zeros(50), torch.zeros(50)
    for step in range(20):
        g = _vector(50, seed=10 + step)
        meant = memory.compensate("b", g)
        values, idx = topk_compress(meant, 5)
        assert idx.dtype == torch.int32 and values.numel() == 5
        kept = meant.abs()[idx.long()]
        rest = meant.abs()[[i for i in range(50) if i not in set(idx.tolist())]]
        assert kept.min() >= rest.max()
        applied = topk_decompress(values, idx, 50)
        memory.remember("b", meant, applied)
        assert torch.equal(memory.residual["b"] + applied, meant)     # e + C(a) == a, exactly
        assert int((memory.residual["b"] != 0).sum()) <= 45
        applied_total += applied
        grad_total += g
    # Σ C(aₜ) = Σ gₜ − e_T: nothing is lost, only delayed (up to float summation order).
    assert torch.allclose(applied_total + memory.residual["b"], grad_total, atol=1e-5)
    assert memory.norm() == pytest.approx(float(memory.residual["b"].norm()))


def test_byte_formulas_match_the_payloads():
    n = 1000
    codes, norms = qsgd_quantize(_vector(n), levels=4, block=256)
    assert to_payload(norms, pack_int4(codes)).numel() == qsgd_bytes(n, levels=4, block=256)
    codes, norms = qsgd_quantize(_vector(n), levels=100, block=256)
    assert to_payload(norms, codes.view(torch.uint8)).numel() == qsgd_bytes(n, levels=100,
                                                                           block=256)
    assert (code_bits(7), code_bits(8)) == (4, 8)
    k = topk_count(n, 0.01)
    values, idx = topk_compress(_vector(n), k)
    assert (k, to_payload(values, idx).numel()) == (10, topk_bytes(k))
    packed, scale = sign_compress(_vector(n))
    assert to_payload(scale, packed).numel() == sign_bytes(n) == 129
    assert block_quantized_bytes(1000, bits=4, block=256) == 4 * 4 + 500
    assert onebit_chunk(1000, 3) == 336 and onebit_chunk(16, 2) == 8
    assert onebit_allreduce_bytes(1000, 2) == 3 * (504 // 8 + 4)
    assert onebit_allreduce_bytes(1000, 2, block=100) == 3 * (504 // 8 + 4 * 6)
    rows = zeropp_volume(1_000)
    assert [r.zeropp / r.zero3 for r in rows] == [0.5, 0.0, 0.25, 0.25]
    assert rows[-1].zero3 == 6_000 and rows[-1].zeropp == 1_500
    with pytest.raises(ValueError, match="density must be in"):
        topk_count(10, 0)
    with pytest.raises(ValueError, match="levels"):
        code_bits(128)


def test_noise_scale_recovers_gradient_and_trace():
    # Exactly E|G_B|² = |G|² + tr(Σ)/B at two batch sizes: the estimator returns both.
    g2, tr = 0.3, 12.0
    est = noise_scale(g2 + tr / 8, g2 + tr / 32, b_small=8, b_big=32)
    assert est.grad_sq == pytest.approx(g2) and est.trace == pytest.approx(tr)
    assert est.b_simple == pytest.approx(40.0)
    # Monte Carlo: per-example gradients N(G, σ²I) in 20 dimensions, batches of 4 and 16.
    gen = torch.Generator().manual_seed(0)
    G, sigma = torch.full((20,), 0.2), 1.5
    small = big = 0.0
    draws = 4000
    for _ in range(draws):
        ex = G + sigma * torch.randn(16, 20, generator=gen)
        small += float(ex[:4].mean(0).pow(2).sum()) / draws
        big += float(ex.mean(0).pow(2).sum()) / draws
    mc = noise_scale(small, big, b_small=4, b_big=16)
    assert mc.trace == pytest.approx(20 * sigma**2, rel=0.05)
    assert mc.grad_sq == pytest.approx(float(G.pow(2).sum()), rel=0.15)
    assert noise_scale(1.0, 1.0, b_small=2, b_big=4).b_simple == 0
    assert math.isinf(noise_scale(3.0, 1.0, b_small=2, b_big=4).b_simple)   # |G|² ≤ 0
    with pytest.raises(ValueError, match="b_big must exceed b_small"):
        noise_scale(1.0, 1.0, b_small=4, b_big=4)


def test_steps_and_examples_lie_on_the_hyperbola():
    for batch in (1, 10, 100, 1000):
        s, e = steps_and_examples(batch, 100)
        assert (s - 1) * (e - 1) == pytest.approx(1.0)
    assert steps_and_examples(100, 100) == (2.0, 2.0)
