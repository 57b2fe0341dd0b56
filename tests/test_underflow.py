"""toolkit.precision.underflow: one backward at a loss scale, gradients unscaled (parameters
and every Linear output's activation gradient), and the count of what fp16 flushes to zero
against an fp32 backward of the same step (Micikevicius et al. 2018, §3.2)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from toolkit.models import GPTConfig, TinyGPT, make_token_data
from toolkit.precision import flushed, record_op_dtypes, scaled_gradients

CFG = GPTConfig(vocab_size=37, seq_len=8, d_model=20, n_head=2, n_layer=2)
X, Y = make_token_data(4, CFG.seq_len, CFG.vocab_size)


def _loss(factor=1.0):
    return lambda m: m(X, Y)[1] * factor


def test_fp32_gradients_are_the_models_and_a_power_of_two_scale_changes_nothing():
    model = TinyGPT(CFG)
    g = scaled_gradients(model, _loss())
    want = torch.cat([p.grad.double().reshape(-1) for p in model.parameters()])
    assert g.params.dtype == torch.float64 and torch.equal(g.params, want)
    scaled = scaled_gradients(model, _loss(), scale=2.0 ** 10)
    # s = 2^k multiplies every value of the backward exactly (fp32, far from its limits).
    assert torch.equal(scaled.params, g.params)
    assert torch.equal(scaled.activations, g.activations)


def test_activation_gradients_cover_every_linear_output():
    model = TinyGPT(CFG)
    sizes = []
    hooks = [m.register_forward_hook(lambda m, i, out: sizes.append(out.numel()))
             for m in model.modules() if isinstance(m, nn.Linear)]
    model(X, Y)
    for h in hooks:
        h.remove()
    g = scaled_gradients(model, _loss())
    assert len(sizes) >= 2 * CFG.n_layer and g.activations.numel() == sum(sizes)
    assert (g.activations != 0).any()


def test_frozen_parameters_contribute_zeros_in_parameter_order():
    model = TinyGPT(CFG)
    first = next(model.parameters())
    first.requires_grad_(False)
    g = scaled_gradients(model, _loss())
    assert g.params.numel() == sum(p.numel() for p in model.parameters())
    assert (g.params[:first.numel()] == 0).all() and (g.params[first.numel():] != 0).any()


def test_fp16_flushes_small_gradients_and_a_loss_scale_brings_them_back():
    model = TinyGPT(CFG)
    small = _loss(2.0 ** -14)
    ref = scaled_gradients(model, small)
    plain = scaled_gradients(model, small, autocast=torch.float16)
    lifted = scaled_gradients(model, small, autocast=torch.float16, scale=2.0 ** 14)
    lost_plain, lost_lifted = flushed(plain.params, ref.params), flushed(lifted.params, ref.params)
    assert lost_plain > 0.05 * ref.params.numel() and lost_lifted < lost_plain // 10
    assert flushed(plain.activations, ref.activations) > flushed(lifted.activations,
                                                                 ref.activations)
    assert torch.isfinite(lifted.params).all()
    # Unscaled, the lifted run is the fp32 gradient up to fp16 rounding of the backward.
    rel = (lifted.params - ref.params).norm() / ref.params.norm()
    assert rel < 0.05
    over = scaled_gradients(model, small, autocast=torch.float16, scale=2.0 ** 40)
    assert not torch.isfinite(over.params).all()                   # past fp16's 65504


def test_gradients_are_cleared_first_so_calls_do_not_accumulate():
    model = TinyGPT(CFG)
    a = scaled_gradients(model, _loss())
    b = scaled_gradients(model, _loss())
    assert torch.equal(a.params, b.params)
    r1 = record_op_dtypes(model, lambda: model(X, Y)[1], autocast=torch.bfloat16)
    g1 = [p.grad.clone() for p in model.parameters()]
    r2 = record_op_dtypes(model, lambda: model(X, Y)[1], autocast=torch.bfloat16)
    assert [(r.op, r.output) for r in r1] == [(r.op, r.output) for r in r2]
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), g1))


def test_flushed_counts_new_zeros_only_and_errors_name_the_argument():
    ref = torch.tensor([1.0, 2e-8, 0.0, 3.0])
    assert flushed(torch.tensor([1.0, 0.0, 0.0, 0.0]), ref) == 2
    assert flushed(ref, ref) == 0
    with pytest.raises(ValueError, match="shapes differ"):
        flushed(torch.zeros(3), torch.zeros(4))
    with pytest.raises(ValueError, match="scale must be > 0"):
        scaled_gradients(TinyGPT(CFG), _loss(), scale=0.0)
