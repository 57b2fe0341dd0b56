"""toolkit.precision.fp8_linear: the three GEMMs of a linear layer on fp8 inputs equal the plain
matmuls of the quantised-dequantised tensors, parameters stay shared (tied weights too), every
recipe trains TinyGPT, and an unscaled cast loses small gradients that the scaled recipes keep."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from toolkit.models import GPTConfig, TinyGPT, make_token_data
from toolkit.precision import fp8
from toolkit.precision.fp8_linear import RECIPES, Fp8Linear, Fp8Recipe, use_fp8

CFG = GPTConfig(vocab_size=37, seq_len=8, d_model=20, n_head=2, n_layer=2)


pytestmark = pytest.mark.usefixtures("one_thread")


def _linear(seed=0):
    torch.manual_seed(seed)
    return nn.Linear(24, 16)


def test_forward_and_backward_are_the_quantised_gemms():
    lin = _linear()
    layer = Fp8Linear(lin, Fp8Recipe("current"))
    assert layer.weight is lin.weight and layer.bias is lin.bias
    x = torch.randn(3, 5, 24, requires_grad=True)
    g = torch.randn(3, 5, 16)
    layer(x).backward(g)
    x2, g2 = x.detach().reshape(-1, 24), g.reshape(-1, 16)
    xq = fp8.current_scaling(x2).dequantize()
    wq = fp8.current_scaling(lin.weight.detach()).dequantize()
    gq = fp8.current_scaling(g2, "fp8 e5m2").dequantize()
    torch.testing.assert_close(x.grad.reshape(-1, 24), gq @ wq)
    torch.testing.assert_close(lin.weight.grad, gq.t() @ xq)
    torch.testing.assert_close(lin.bias.grad, g2.sum(0))
    with torch.no_grad():
        torch.testing.assert_close(layer(x), (xq @ wq.t() + lin.bias).view(3, 5, 16))


def test_recipes_choose_formats_and_block_layouts():
    assert Fp8Recipe("delayed").fmt("grad") == "fp8 e5m2"
    assert Fp8Recipe("blocks").fmt("grad") == "fp8 e4m3"
    layer = Fp8Linear(_linear(), Fp8Recipe("blocks"))
    w = torch.randn(300, 200)
    torch.testing.assert_close(layer.cast("weight", w),
                               fp8.quantize_blocks(w, block=(128, 128)).dequantize())
    torch.testing.assert_close(layer.cast("input", w), fp8.quantize_blocks(w).dequantize())
    assert layer.stats["weight"].amaxes == [pytest.approx(w.abs().max().item())]
    with pytest.raises(ValueError, match="name must be one of"):
        Fp8Recipe("int8")
    with pytest.raises(TypeError, match="nn.Linear"):
        Fp8Linear(nn.Conv1d(2, 2, 1))


def test_use_fp8_keeps_ties_and_skips_the_head():
    model = TinyGPT(CFG)
    swapped = use_fp8(model, Fp8Recipe("mx"))
    assert "lm_head" not in swapped and len(swapped) == CFG.n_layer * 6
    assert model.lm_head.weight is model.tok_emb.weight
    assert isinstance(model.blocks[0].mlp.up_proj, Fp8Linear)
    with pytest.raises(ValueError, match="no nn.Linear"):
        use_fp8(nn.Sequential(nn.ReLU()))


@functools.lru_cache(maxsize=None)  # the fp32 references are shared by several tests
def _train(recipe, steps=12, factor=1.0):
    torch.manual_seed(0)
    model = TinyGPT(CFG)
    layers = use_fp8(model, Fp8Recipe(recipe)) if recipe else {}
    x, y = make_token_data(8 * steps, CFG.seq_len, CFG.vocab_size)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for s in range(steps):
        opt.zero_grad()
        loss = model(x[8 * s:8 * s + 8], y[8 * s:8 * s + 8])[1]
        (loss * factor).backward()
        opt.step()
        losses.append(loss.item())
    return losses, layers


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_trains_tinygpt_close_to_fp32(recipe):
    ref, _ = _train(None)
    losses, layers = _train(recipe)
    assert losses[-1] < losses[0] - 0.3
    assert abs(losses[-1] - ref[-1]) < 0.05 * ref[-1]
    up = layers["blocks.0.mlp.up_proj"]
    assert len(up.stats["input"].amaxes) == 12 and len(up.stats["grad"].amaxes) == 12
    if recipe == "delayed":
        assert up.stats["grad"].scaler.history == pytest.approx(up.stats["grad"].amaxes)


def test_without_a_scale_small_gradients_flush_and_training_falls_behind():
    factor = 2.0 ** -12                      # small gradients, as in lesson 05's section 4
    ref, _ = _train(None, factor=factor)
    plain, layers = _train("unscaled", factor=factor)
    scaled, _ = _train("current", factor=factor)
    assert max(layers["blocks.0.mlp.up_proj"].stats["grad"].amaxes) < 2.0 ** -14  # e5m2 subnormal
    assert plain[-1] - ref[-1] > 3 * abs(scaled[-1] - ref[-1])
