"""The shared tiny models: seeded and RNG-neutral construction, shapes, gradients, tied weights,
causality, config validation, data helpers and the analytic parameter count."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch import nn

from toolkit.models import (
    GPTConfig,
    TinyGPT,
    TinyMLP,
    count_parameters,
    gpt_param_count,
    make_regression_data,
    make_token_data,
)

SMALL = GPTConfig(vocab_size=32, seq_len=8, d_model=16, n_head=2, n_layer=2)


def _same_params(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _builders():
    return [
        pytest.param(lambda seed: TinyMLP(seed=seed), id="mlp"),
        pytest.param(lambda seed: TinyGPT(dataclasses.replace(SMALL, seed=seed)), id="gpt"),
    ]


# --- seeding ----------------------------------------------------------------------------------


@pytest.mark.parametrize("build", _builders())
def test_same_seed_gives_bitwise_identical_parameters(build) -> None:
    a, b = build(3), build(3)
    assert _same_params(a, b)
    # Not vacuous: weights are random, not constant.
    assert any(p.std() > 0 for p in a.parameters() if p.numel() > 1)


@pytest.mark.parametrize("build", _builders())
def test_different_seed_gives_different_parameters(build) -> None:
    assert not _same_params(build(0), build(1))


@pytest.mark.parametrize("build", _builders())
def test_construction_leaves_global_rng_untouched(build) -> None:
    torch.manual_seed(1234)
    before = torch.get_rng_state()
    build(0)
    assert torch.equal(torch.get_rng_state(), before)
    # And the global seed has no say in the weights.
    torch.manual_seed(999)
    m1 = build(0)
    torch.manual_seed(5)
    assert _same_params(m1, build(0))


def test_data_helpers_leave_global_rng_untouched() -> None:
    before = torch.get_rng_state()
    make_regression_data(10, 3, 2)
    make_token_data(10, 4, 8)
    assert torch.equal(torch.get_rng_state(), before)


# --- TinyMLP ----------------------------------------------------------------------------------


def test_mlp_structure_and_shapes() -> None:
    m = TinyMLP(d_in=5, d_hidden=7, d_out=3, depth=3)
    linears = [layer for layer in m.layers if isinstance(layer, nn.Linear)]
    assert isinstance(m.layers, nn.Sequential)
    assert [(lin.in_features, lin.out_features) for lin in linears] == [
        (5, 7), (7, 7), (7, 7), (7, 3)]
    assert len(m.layers) == 2 * 3 + 1  # Linear, ReLU, ... Linear
    assert m(torch.randn(6, 5)).shape == (6, 3)
    # Slicing .layers (as pipeline stages will) composes back to the full model.
    x = torch.randn(4, 5)
    torch.testing.assert_close(m.layers[3:](m.layers[:3](x)), m(x), rtol=0, atol=0)


def test_mlp_depth_zero_is_one_linear() -> None:
    m = TinyMLP(d_in=4, d_out=2, depth=0)
    assert len(m.layers) == 1 and isinstance(m.layers[0], nn.Linear)
    assert count_parameters(m) == 4 * 2 + 2


def test_mlp_backward_fills_every_grad() -> None:
    m = TinyMLP()
    x, y = make_regression_data(16, 8, 4)
    nn.functional.mse_loss(m(x), y).backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("kwargs", [{"d_in": 0}, {"d_hidden": -1}, {"d_out": 2.5}, {"depth": -1}])
def test_mlp_rejects_bad_sizes(kwargs) -> None:
    (field,) = kwargs
    with pytest.raises(ValueError, match=field):
        TinyMLP(**kwargs)


# --- TinyGPT ----------------------------------------------------------------------------------


def test_gpt_forward_shapes_without_and_with_targets() -> None:
    model = TinyGPT(SMALL)
    x, y = make_token_data(3, SMALL.seq_len, SMALL.vocab_size)
    logits, loss = model(x)
    assert logits.shape == (3, SMALL.seq_len, SMALL.vocab_size) and loss is None
    logits2, loss = model(x, y)
    assert torch.equal(logits, logits2)
    assert loss.shape == () and torch.isfinite(loss)
    # Freshly initialised (std 0.02) the prediction is near uniform.
    assert abs(loss.item() - math.log(SMALL.vocab_size)) < 0.5
    # Shorter sequences are fine, longer ones are refused.
    assert model(x[:, :5])[0].shape == (3, 5, SMALL.vocab_size)
    with pytest.raises(ValueError, match="seq_len"):
        model(torch.zeros(1, SMALL.seq_len + 1, dtype=torch.long))


def test_gpt_loss_is_mean_cross_entropy() -> None:
    model = TinyGPT(SMALL)
    x, y = make_token_data(2, SMALL.seq_len, SMALL.vocab_size, seed=4)
    logits, loss = model(x, y)
    manual = -logits.log_softmax(-1).gather(-1, y.unsqueeze(-1)).mean()
    torch.testing.assert_close(loss, manual)


@pytest.mark.parametrize("tie", [True, False])
def test_gpt_backward_fills_every_trainable_grad(tie: bool) -> None:
    model = TinyGPT(dataclasses.replace(SMALL, tie_weights=tie))
    x, y = make_token_data(4, SMALL.seq_len, SMALL.vocab_size)
    _, loss = model(x, y)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_gpt_tied_weights_are_one_tensor_counted_once() -> None:
    model = TinyGPT(SMALL)
    assert model.lm_head.weight is model.tok_emb.weight
    names = [n for n, _ in model.named_parameters()]
    assert "tok_emb.weight" in names and "lm_head.weight" not in names
    untied = TinyGPT(dataclasses.replace(SMALL, tie_weights=False))
    assert count_parameters(untied) - count_parameters(model) == SMALL.vocab_size * SMALL.d_model
    # Training the head trains the embedding: one tensor, one update.
    with torch.no_grad():
        model.lm_head.weight[0, 0] += 1.0
    assert model.tok_emb.weight[0, 0] == model.lm_head.weight[0, 0]


def test_gpt_untied_weights_are_separate() -> None:
    model = TinyGPT(dataclasses.replace(SMALL, tie_weights=False))
    assert model.lm_head.weight is not model.tok_emb.weight
    assert model.lm_head.weight.data_ptr() != model.tok_emb.weight.data_ptr()
    assert not torch.equal(model.lm_head.weight, model.tok_emb.weight)
    names = [n for n, _ in model.named_parameters()]
    assert "tok_emb.weight" in names and "lm_head.weight" in names


def test_gpt_structure_exposes_blocks_and_split_projections() -> None:
    cfg = dataclasses.replace(SMALL, n_layer=3, d_ff=24)
    model = TinyGPT(cfg)
    assert isinstance(model.blocks, nn.ModuleList) and len(model.blocks) == 3
    attn = model.blocks[0].attn
    for proj in (attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj):
        assert proj.weight.shape == (cfg.d_model, cfg.d_model)
    mlp = model.blocks[0].mlp
    assert mlp.up_proj.weight.shape == (24, cfg.d_model)
    assert mlp.down_proj.weight.shape == (cfg.d_model, 24)


def test_gpt_is_causal() -> None:
    model = TinyGPT(SMALL)
    x, _ = make_token_data(2, SMALL.seq_len, SMALL.vocab_size, seed=1)
    t = 5
    x2 = x.clone()
    x2[:, t:] = (x2[:, t:] + 1) % SMALL.vocab_size  # change the present and every future token
    a, _ = model(x)
    b, _ = model(x2)
    torch.testing.assert_close(a[:, :t], b[:, :t], rtol=0, atol=1e-6)
    assert not torch.allclose(a[:, t:], b[:, t:])  # the changed positions do matter


def test_gpt_dropout_only_acts_in_training() -> None:
    model = TinyGPT(dataclasses.replace(SMALL, dropout=0.5))
    x, _ = make_token_data(2, SMALL.seq_len, SMALL.vocab_size)
    model.eval()
    assert torch.equal(model(x)[0], model(x)[0])
    model.train()
    torch.manual_seed(0)
    assert not torch.equal(model(x)[0], model(x)[0])


def test_gpt_learns_token_data() -> None:
    model = TinyGPT(SMALL)
    x, y = make_token_data(64, SMALL.seq_len, SMALL.vocab_size)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    first = None
    for _ in range(40):
        _, loss = model(x, y)
        first = loss.item() if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.5 * first


# --- GPTConfig --------------------------------------------------------------------------------


def test_config_defaults_and_derived_sizes() -> None:
    cfg = GPTConfig()
    assert (cfg.vocab_size, cfg.seq_len, cfg.d_model, cfg.n_head, cfg.n_layer) == (64, 16, 32, 4, 2)
    assert cfg.d_ff is None and cfg.ff_dim == 128 and cfg.head_dim == 8
    assert (cfg.dropout, cfg.tie_weights, cfg.seed) == (0.0, True, 0)
    assert GPTConfig(d_ff=10).ff_dim == 10
    # d_ff=None follows d_model when the config is varied.
    assert dataclasses.replace(cfg, d_model=64).ff_dim == 256


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"vocab_size": 0}, "vocab_size"),
        ({"seq_len": -1}, "seq_len"),
        ({"d_model": 0}, "d_model"),
        ({"n_head": 0}, "n_head"),
        ({"n_layer": 0}, "n_layer"),
        ({"d_ff": 0}, "d_ff"),
        ({"d_model": 30, "n_head": 4}, "divisible by n_head"),
        ({"dropout": 1.0}, "dropout"),
        ({"d_model": 32.0}, "d_model"),
    ],
)
def test_config_validation_names_the_field(kwargs, field: str) -> None:
    with pytest.raises(ValueError, match=field) as info:
        GPTConfig(**kwargs)
    assert "GPTConfig" in str(info.value)
    assert repr(next(iter(kwargs.values()))) in str(info.value)  # says what it got


# --- counting ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cfg",
    [
        GPTConfig(),
        GPTConfig(tie_weights=False),
        GPTConfig(vocab_size=50, seq_len=7, d_model=24, n_head=3, n_layer=3, d_ff=40),
        GPTConfig(vocab_size=50, seq_len=7, d_model=24, n_head=3, n_layer=1, tie_weights=False),
    ],
    ids=["default", "untied", "odd-sizes", "untied-1layer"],
)
def test_gpt_param_count_matches_model(cfg: GPTConfig) -> None:
    model = TinyGPT(cfg)
    assert gpt_param_count(cfg) == count_parameters(model)
    # Independent of the deduplication count_parameters relies on.
    unique = {id(p): p.numel() for m in model.modules() for p in m.parameters(recurse=False)}
    assert sum(unique.values()) == gpt_param_count(cfg)


def test_count_parameters_trainable_only() -> None:
    m = TinyMLP(d_in=2, d_hidden=3, d_out=1, depth=1)
    assert count_parameters(m) == (2 * 3 + 3) + (3 * 1 + 1)
    m.layers[0].weight.requires_grad_(False)
    assert count_parameters(m, trainable_only=True) == 3 + 3 * 1 + 1
    assert count_parameters(m) == 13


# --- data helpers -----------------------------------------------------------------------------


def test_regression_data_is_deterministic_and_shaped() -> None:
    x, y = make_regression_data(20, 5, 3, seed=7)
    assert x.shape == (20, 5) and y.shape == (20, 3)
    assert x.dtype == y.dtype == torch.float32
    x2, y2 = make_regression_data(20, 5, 3, seed=7)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    x3, _ = make_regression_data(20, 5, 3, seed=8)
    assert not torch.equal(x, x3)
    # y is (nearly) linear in x: least squares leaves only the small noise.
    w = torch.linalg.lstsq(x, y).solution
    assert (x @ w - y).abs().max() < 0.1


def test_token_data_is_deterministic_shifted_and_in_range() -> None:
    x, y = make_token_data(10, 6, 11, seed=2)
    assert x.shape == y.shape == (10, 6) and x.dtype == y.dtype == torch.long
    assert int(x.min()) >= 0 and int(x.max()) < 11 and int(y.max()) < 11
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one
    x2, y2 = make_token_data(10, 6, 11, seed=2)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert not torch.equal(x, make_token_data(10, 6, 11, seed=3)[0])
    # Learnable: each token always has the same successor.
    succ: dict[int, int] = {}
    for a, b in zip(x.flatten().tolist(), y.flatten().tolist()):
        assert succ.setdefault(a, b) == b


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda: make_regression_data(0, 2, 2), "n"),
        (lambda: make_regression_data(4, 0, 2), "d_in"),
        (lambda: make_token_data(4, 0, 5), "seq_len"),
        (lambda: make_token_data(4, 3, 0), "vocab_size"),
    ],
)
def test_data_helpers_reject_bad_sizes(call, field: str) -> None:
    with pytest.raises(ValueError, match=rf"\b{field} must be"):
        call()
