"""toolkit.flops: the 6N + 12·L·h·s count equals what FlopCounterMode sees, recomputation shows
up as hardware FLOPs, and MFU/HFU are the ratios the papers define."""

from __future__ import annotations

import dataclasses

import pytest

from toolkit.flops import (
    A100_BF16, H100_SXM_BF16, PEAK_FLOPS, count_flops, flops_per_token, hfu, matmul_params,
    matmul_peak, mfu, recompute_flops, step_flops,
)
from toolkit.experiments.flops import measure_step
from toolkit.models import GPTConfig, TinyGPT, make_token_data
from toolkit.recompute import CheckpointedGPT

CFG = GPTConfig(vocab_size=48, seq_len=16, d_model=32, n_head=4, n_layer=3, d_ff=96)


pytestmark = pytest.mark.usefixtures("one_thread")


def _step(cfg: GPTConfig, batch: int, seq: int, every=None) -> int:
    model = TinyGPT(cfg)
    x, y = make_token_data(batch, seq, cfg.vocab_size)
    wrapped = CheckpointedGPT(model, every=every)
    return count_flops(lambda: wrapped(x, y)[1].backward())


@pytest.mark.parametrize("cfg, batch, seq", [
    (CFG, 4, 16),
    (CFG, 3, 10),  # shorter than cfg.seq_len: the attention term follows s
    (dataclasses.replace(CFG, tie_weights=False, n_layer=2, d_ff=None), 2, 16),
])
def test_formula_equals_counted_matmuls(cfg: GPTConfig, batch: int, seq: int) -> None:
    want = step_flops(cfg, batch, seq_len=seq)["model"]
    assert _step(cfg, batch, seq) == pytest.approx(want, rel=1e-9)


def test_recomputation_is_hardware_flops_not_model_flops() -> None:
    batch, s, h, f = 4, CFG.seq_len, CFG.d_model, CFG.ff_dim
    tokens = batch * s
    plain = _step(CFG, batch, s)
    full = step_flops(CFG, batch, recompute="full")
    assert full["model"] == plain
    # One forward of every block again, less the last matmul of each segment (down_proj): PyTorch
    # stops rerunning a segment once every tensor backward needs is back.
    down = 2 * h * f * tokens
    for every in (1, 3):
        segments = -(-CFG.n_layer // every)
        assert _step(CFG, batch, s, every) == full["hardware"] - segments * down
    assert recompute_flops(CFG, recompute="selective") == 4 * CFG.n_layer * h * s
    assert recompute_flops(CFG, recompute="none") == 0
    with pytest.raises(ValueError, match="recompute must be"):
        recompute_flops(CFG, recompute="some")


def test_published_shapes_and_utilisation() -> None:
    # GPT-3 175B (Brown et al., 2020, table 2.1): 96 layers, h = 12288, s = 2048, V = 50257.
    gpt3 = GPTConfig(vocab_size=50257, seq_len=2048, d_model=12288, n_head=96, n_layer=96)
    assert matmul_params(gpt3) == pytest.approx(175e9, rel=0.01)
    per_token = flops_per_token(gpt3)
    # Attention adds 12·L·h·s / 6N ≈ s / (6h)·... ≈ 2.8 % at s = 2048 (PaLM appendix B).
    assert per_token / (6 * matmul_params(gpt3)) == pytest.approx(1 + 12 * 96 * 12288 * 2048 / (
        6 * matmul_params(gpt3)), rel=1e-12)
    assert 1.02 < per_token / (6 * matmul_params(gpt3)) < 1.04
    # MFU: a step of 1e15 model FLOPs in 10 s on one A100 is 1e14 / 312e12.
    assert mfu(1e15, 10.0, A100_BF16) == pytest.approx(1e14 / 312e12)
    assert hfu(1.25e15, 10.0, A100_BF16) > mfu(1e15, 10.0, A100_BF16)
    assert PEAK_FLOPS["H100 SXM bf16"] == H100_SXM_BF16 == 989e12
    with pytest.raises(ValueError, match="seconds > 0"):
        mfu(1.0, 0.0, A100_BF16)
    with pytest.raises(ValueError, match="batch"):
        step_flops(CFG, 0)
    with pytest.raises(ValueError, match="seq_len"):
        flops_per_token(CFG, seq_len=0)


def test_measured_step_here() -> None:
    model = TinyGPT(CFG)
    x, y = make_token_data(4, CFG.seq_len, CFG.vocab_size)
    got = measure_step(model, x, y, repeats=2)
    assert got["counted_flops"] == got["model_flops"]
    assert got["seconds"] > 0 and got["flops_per_s"] == got["model_flops"] / got["seconds"]
    assert all(p.grad is None for p in model.parameters())  # measuring leaves no gradients
    # How it compares with the matmul peak is up to the machine's load (a lesson shows it); a
    # test can only ask for a finite positive rate.
    assert 0 < matmul_peak(64, repeats=2) < float("inf")
