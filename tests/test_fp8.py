"""toolkit.precision.fp8 against known values: the formats' limits, saturation, Transformer
Engine's scale and delayed update, OCP MX's shared exponent (floor and rounded up), DeepSeek-V3's
1×128 / 128×128 blocks, bits per element, and torch's fp8 GEMM equal to the dequantised matmul;
on a GPU (marked `gpu`) the casts are bitwise the CPU's and the GEMM agrees."""

from __future__ import annotations

import math

import pytest
import torch

from toolkit.launch import device, gpu_count, spawn
from toolkit.models import make_regression_data
from toolkit.precision import fp8


def test_limits_and_emax_of_the_two_formats():
    # Micikevicius et al. 2022, Table 1: 448 = 1.75 · 2^8 and 57344 = 1.75 · 2^15.
    assert fp8.fp8_max("fp8 e4m3") == 448 and fp8.fp8_max("fp8 e5m2") == 57344
    assert fp8.emax("fp8 e4m3") == 8 and fp8.emax("fp8 e5m2") == 15
    with pytest.raises(ValueError, match="fmt must be one of"):
        fp8.fp8_max("bf16")


def test_saturating_cast_clips_instead_of_inf():
    x = torch.tensor([1e6, -1e6, 500.0, 1.0, float("nan")])
    e4 = fp8.saturating_cast(x, "fp8 e4m3").float()
    assert e4[:4].tolist() == [448, -448, 448, 1] and math.isnan(e4[4])
    e5 = fp8.saturating_cast(torch.tensor([1e6, 6e4]), "fp8 e5m2").float()
    assert e5.tolist() == [57344, 57344]          # a plain cast gives inf for both
    assert torch.isinf(torch.tensor([1e6]).to(torch.float8_e5m2).float()).all()


def test_scale_maps_the_amax_to_the_top_less_the_margin():
    s = fp8.scale_for(torch.tensor(3.5), "fp8 e4m3")
    assert float(s) == pytest.approx(448 / 3.5)
    assert float(fp8.scale_for(torch.tensor(3.5), "fp8 e4m3", margin=2)) == pytest.approx(32)
    assert float(fp8.scale_for(torch.tensor(0.0), "fp8 e4m3")) == 1.0
    assert float(fp8.scale_for(torch.tensor(float("inf")), "fp8 e4m3")) == 1.0


def test_current_scaling_puts_the_amax_on_448_and_round_trips_within_half_an_ulp():
    x = torch.randn(64, 48, generator=torch.Generator().manual_seed(0))
    q = fp8.current_scaling(x)
    assert q.data.dtype == torch.float8_e4m3fn and q.scale_inv.dim() == 0
    assert q.data.float().abs().max().item() == 448
    back = q.dequantize()
    # Normal e4m3 values are within 2^-4 relative (3 fraction bits); tiny ones within half the
    # smallest subnormal (2^-10) in scaled units.
    bound = torch.maximum(x.abs() * 2.0 ** -4, torch.full_like(x, 2.0 ** -10) * q.scale_inv)
    assert ((back - x).abs() <= bound + 1e-12).all()


def test_delayed_scaler_uses_the_previous_amaxes_and_counts_overflows():
    recipe = fp8.DelayedScaling(amax_history_len=2, amax_compute_algo="max")
    scaler = fp8.DelayedScaler(recipe)
    scaler.quantize(torch.tensor([4.0]))          # scale 1 at the first call, then 448 / 4
    assert scaler.scale == pytest.approx(112.0)
    q = scaler.quantize(torch.tensor([8.0]))      # cast with 112: 896 saturates to 448
    assert q.data.float().item() == 448 and scaler.overflows == 1
    assert scaler.scale == pytest.approx(56.0)    # max of [4, 8]
    scaler.quantize(torch.tensor([1.0]))
    assert scaler.history == [8.0, 1.0] and scaler.scale == pytest.approx(56.0)
    scaler.quantize(torch.tensor([1.0]))          # the 8 has left the window of 2
    assert scaler.scale == pytest.approx(448.0)
    recent = fp8.DelayedScaling(amax_compute_algo="most_recent", margin=1)
    assert fp8.next_delayed_scale([8.0, 2.0], recent) == pytest.approx(448 / 2 / 2)


def test_delayed_scales_of_a_run_are_one_step_behind():
    scales = fp8.delayed_scales([1.0, 2.0, 4.0, 0.0], fp8.DelayedScaling(amax_history_len=1))
    assert scales == pytest.approx([1.0, 448.0, 224.0, 112.0])
    with pytest.raises(ValueError, match="amax_history_len"):
        fp8.DelayedScaling(amax_history_len=0)
    with pytest.raises(ValueError, match="amax_compute_algo"):
        fp8.DelayedScaling(amax_compute_algo="mean")


def test_mx_shared_exponent_follows_the_spec_and_the_rounded_up_rule():
    # One block of 32 with amax 1.9 · 2^3 = 15.2: floor rule E = 3 - 8 = -5, so the amax
    # becomes 15.2 · 32 = 486.4 > 448 and saturates; rounded up, E = ceil(log2(15.2 / 448)) = -4.
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 1] = 15.2, 1.0
    floor = fp8.quantize_mx(x)
    assert floor.scale_inv.dtype == torch.float8_e8m0fnu
    assert floor.scale_inv.float().item() == 2.0 ** -5
    assert floor.dequantize()[0, 0].item() == 448 * 2.0 ** -5      # clipped to 14
    up = fp8.quantize_mx(x, scale_rounding="up")
    assert up.scale_inv.float().item() == 2.0 ** -4
    assert up.dequantize()[0, 0].item() == pytest.approx(15.0)     # 240 · 2^-4, no clipping
    assert floor.bits_per_element == 8 + 8 / 32


def test_mx_blocks_are_independent_and_zero_blocks_stay_zero():
    x = torch.cat([torch.full((2, 32), 1e-3), torch.zeros(2, 32), torch.full((2, 32), 100.0)], 1)
    q = fp8.quantize_mx(x)
    assert q.scale_inv.shape == (2, 3)
    back = q.dequantize()
    assert torch.equal(back[:, 32:64], torch.zeros(2, 32))
    assert torch.allclose(back[:, :32], x[:, :32], rtol=2 ** -4)
    assert torch.allclose(back[:, 64:], x[:, 64:], rtol=2 ** -4)


def test_deepseek_tiles_and_blocks_one_fp32_scale_each():
    gen = torch.Generator().manual_seed(1)
    act = torch.randn(4, 300, generator=gen)
    act[:, 7] *= 1000                                   # an outlier channel in the first tile
    tiles = fp8.quantize_blocks(act, block=(1, 128))
    assert tiles.scale_inv.shape == (4, 3) and tiles.block == (1, 128)
    # Each tile's amax lands exactly on 448; the tiles without the outlier keep their precision.
    scaled = act / tiles.scale_inv.repeat_interleave(128, 1)[:, :300]
    assert torch.allclose(scaled.abs().reshape(4, -1)[:, :128].amax(1), torch.full((4,), 448.0))
    rest = (tiles.dequantize() - act)[:, 128:].abs() / act[:, 128:].abs()
    assert rest.max() <= 2 ** -4 + 1e-6
    weight = fp8.quantize_blocks(torch.randn(256, 200, generator=gen), block=(128, 128))
    assert weight.scale_inv.shape == (2, 2)
    assert weight.bits_per_element == pytest.approx(8 + 32 * 4 / (256 * 200))
    assert fp8.quantize_blocks(torch.randn(3, 32, generator=gen)).block == (1, 32)  # clipped
    with pytest.raises(ValueError, match="2-D"):
        fp8.quantize_blocks(torch.randn(2, 3, 4))


def test_scaled_mm_equals_the_dequantised_matmul():
    gen = torch.Generator().manual_seed(2)
    a = fp8.current_scaling(torch.randn(32, 64, generator=gen))
    b = fp8.current_scaling(torch.randn(48, 64, generator=gen) * 1e-3)
    out = fp8.scaled_matmul(a, b, out_dtype=torch.float32)
    want = a.dequantize() @ b.dequantize().t()
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="per-tensor"):
        fp8.scaled_matmul(fp8.quantize_mx(torch.randn(32, 64)), b)


def _fp8_on_the_rank_device(rank, world_size):
    a = make_regression_data(64, 256, 1, seed=0, device=device())[0]
    b = make_regression_data(32, 256, 1, seed=1, device=device())[0] * 1e-3
    casts = {"tensor": fp8.current_scaling(a), "mx": fp8.quantize_mx(a),
             "blocks": fp8.quantize_blocks(a, block=(1, 128))}
    bits = {name: q.data.view(torch.uint8).cpu() for name, q in casts.items()}
    qa, qb = casts["tensor"], fp8.current_scaling(b)
    gemm = None
    if device().type == "cpu" or torch.cuda.get_device_capability(device()) >= (8, 9):
        out = fp8.scaled_matmul(qa, qb, out_dtype=torch.bfloat16)
        want = qa.dequantize() @ qb.dequantize().t()
        gemm = float((out.float() - want).abs().max() / want.abs().max())
    return str(device()), bits, gemm


@pytest.mark.gpu
@pytest.mark.multirank
@pytest.mark.skipif(gpu_count() < 1, reason="needs a CUDA GPU")
def test_fp8_casts_are_bitwise_the_cpus_on_a_gpu_and_its_gemm_agrees():
    on_gpu = spawn(_fp8_on_the_rank_device, 1, timeout=180)[0]
    on_cpu = spawn(_fp8_on_the_rank_device, 1, backend="gloo", timeout=60)[0]
    assert on_gpu[0].startswith("cuda") and on_cpu[0] == "cpu"
    for name, bits in on_cpu[1].items():
        assert torch.equal(on_gpu[1][name], bits), name
    if on_gpu[2] is not None:                 # an fp8 tensor-core GPU (sm_89 or newer)
        assert on_gpu[2] <= 2.0 ** -8         # one bf16 rounding of the exact product
