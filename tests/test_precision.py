"""toolkit.precision on one process: master weights (the copy, the cast, the step against an
fp32 reference fed the same gradients, a weight that never moves without them, 2 + 2 + 12
bytes held, state dict round trip), the loss scaler (the rule, equality with
torch.amp.GradScaler on CPU, unscale once, state dict round trip), and the recorded dtypes of
TinyGPT under CPU autocast."""

from __future__ import annotations

import copy
import io

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from toolkit import memory as M
from toolkit.models import GPTConfig, TinyGPT, count_parameters, make_token_data
from toolkit.precision import (
    DynamicLossScaler, MasterWeightOptimizer, autocast_policy, copy_to_working, master_copy,
    master_weights, next_scale, record_op_dtypes,
)

CFG = GPTConfig(vocab_size=37, seq_len=8, d_model=20, n_head=2, n_layer=2)


def _batch(n=4):
    return make_token_data(n, CFG.seq_len, CFG.vocab_size)


def test_master_copy_and_cast_to_working():
    params = [nn.Parameter(torch.randn(5, 3).to(torch.bfloat16)) for _ in range(2)]
    masters = master_copy(params)
    assert all(m.dtype == torch.float32 and m.is_leaf and m.requires_grad for m in masters)
    assert all(torch.equal(m, p.float()) for m, p in zip(masters, params))
    with torch.no_grad():
        for m in masters:
            m.add_(1e-3)  # below half an ulp of most bf16 values near 1: rounding decides
    storage = params[0].untyped_storage().data_ptr()
    copy_to_working(masters, params)
    assert params[0].untyped_storage().data_ptr() == storage  # in place, same tensor
    assert all(torch.equal(p, m.to(torch.bfloat16)) for m, p in zip(masters, params))
    with pytest.raises(ValueError, match="shape"):
        copy_to_working([torch.zeros(2)], [torch.zeros(3)])
    with pytest.raises(ValueError, match="floating"):
        master_copy(params, torch.int32)


def test_masters_step_exactly_as_fp32_adam_fed_the_same_gradients():
    gen = torch.Generator().manual_seed(0)
    shapes = [(7, 5), (5,), (3, 7)]
    working = [nn.Parameter(torch.randn(s, generator=gen).to(torch.bfloat16)) for s in shapes]
    fp32 = [nn.Parameter(p.detach().float().clone()) for p in working]
    opt = MasterWeightOptimizer(working, torch.optim.Adam, lr=1e-2, betas=(0.8, 0.9))
    ref = torch.optim.Adam(fp32, lr=1e-2, betas=(0.8, 0.9))
    for _ in range(5):
        for p, q in zip(working, fp32):
            g = torch.randn(p.shape, generator=gen).to(torch.bfloat16)
            p.grad, q.grad = g, g.float()
        opt.step()
        ref.step()
    for p, q in zip(working, fp32):
        assert torch.equal(opt.master(p), q)                  # the master is fp32 Adam, exactly
        assert torch.equal(p, q.detach().to(torch.bfloat16))  # the working copy is its rounding
        assert opt.master(p).grad is None                      # fp32 gradient gone after step


@pytest.mark.parametrize("fmt", [torch.bfloat16, torch.float16])
def test_a_weight_that_never_moves_without_masters(fmt):
    # bf16 spacing just below 1.0 is 2^-8: an update of 1e-3 < 2^-9 rounds away every step.
    # fp16's is 2^-11, so 1e-3 moves it, but by a rounded amount.
    pure = nn.Parameter(torch.ones(1, dtype=fmt))
    kept = nn.Parameter(torch.ones(1, dtype=fmt))
    plain = torch.optim.SGD([pure], lr=1e-3)
    master = MasterWeightOptimizer([kept], torch.optim.SGD, lr=1e-3)
    for _ in range(100):
        pure.grad = torch.ones(1, dtype=fmt)
        kept.grad = torch.ones(1, dtype=fmt)
        plain.step()
        master.step()
    assert master.master(kept).item() == pytest.approx(0.9, abs=1e-5)  # fp32 sum of 1e-3s
    assert kept.item() == torch.tensor(master.master(kept).item()).to(fmt).item()
    if fmt is torch.bfloat16:
        assert pure.item() == 1.0
    else:
        assert pure.item() != pytest.approx(0.9, abs=1e-5)  # moved, by rounded steps


def test_held_bytes_are_2_2_12_and_the_state_keeps_the_masters():
    model = TinyGPT(CFG).to(torch.bfloat16)  # tied embedding/head: counted once
    opt = MasterWeightOptimizer(model.parameters(), torch.optim.Adam, lr=1e-3)
    x, y = _batch()
    model(x, y)[1].backward()
    opt.step()
    psi = count_parameters(model)
    held = M.held_model_states(model, opt)
    want = M.model_state_bytes(psi, recipe=M.MIXED_ADAM)
    assert (held.params, held.grads, held.optimizer) == (want.params, want.grads, want.optimizer)
    assert held.step_bytes == 4 * len(list(model.parameters()))  # Adam's 0-dim step, apart
    state = opt.state_dict()["state"]
    assert {k: v.dtype for k, v in state[0].items()} == {
        "master": torch.float32, "exp_avg": torch.float32, "exp_avg_sq": torch.float32,
        "step": torch.float32}


def _train(model, opt, scaler, steps, x, y):
    for _ in range(steps):
        opt.zero_grad()
        scaler.scale(model(x, y)[1]).backward()
        scaler.step(opt)
        scaler.update()


def test_state_dict_round_trip_resumes_bit_for_bit():
    x, y = _batch()
    run = TinyGPT(CFG).to(torch.bfloat16)
    opt = MasterWeightOptimizer(run.parameters(), torch.optim.Adam, lr=3e-3)
    scaler = DynamicLossScaler(2.0 ** 10, growth_interval=2)
    _train(run, opt, scaler, 3, x, y)
    buf = io.BytesIO()
    torch.save({"model": run.state_dict(), "opt": opt.state_dict(),
                "scaler": scaler.state_dict()}, buf)
    _train(run, opt, scaler, 3, x, y)

    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    resumed = TinyGPT(CFG).to(torch.bfloat16)
    resumed.load_state_dict(saved["model"])
    opt2 = MasterWeightOptimizer(resumed.parameters(), torch.optim.Adam, lr=3e-3)
    opt2.load_state_dict(saved["opt"])
    scaler2 = DynamicLossScaler()
    scaler2.load_state_dict(saved["scaler"])
    assert all(opt2.master(p).dtype == torch.float32 for p in resumed.parameters())
    _train(resumed, opt2, scaler2, 3, x, y)
    for a, b in zip(run.parameters(), resumed.parameters()):
        assert torch.equal(a, b) and torch.equal(opt.master(a), opt2.master(b))
    assert scaler2.state_dict() == scaler.state_dict()


def test_state_dict_rejects_other_parameters():
    a = MasterWeightOptimizer([nn.Parameter(torch.zeros(2))], lr=0.1)
    b = MasterWeightOptimizer([nn.Parameter(torch.zeros(2)), nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(ValueError, match="param groups"):
        b.load_state_dict(a.state_dict())


def test_unscale_into_fp32_keeps_what_fp16_would_flush():
    p = nn.Parameter(torch.zeros(2, dtype=torch.float16))
    opt = MasterWeightOptimizer([p], torch.optim.SGD, lr=1.0)
    p.grad = torch.tensor([2.0 ** -14, 1.0], dtype=torch.float16)  # scaled by 2^10
    found = opt.unscale_(2.0 ** -10)
    assert found.item() == 0
    assert opt.master(p).grad.tolist() == [2.0 ** -24 * 1.0, 2.0 ** -10]
    # Divided in fp16 instead, 2^-24 is its smallest subnormal and 2^-25 already flushes:
    assert torch.tensor(2.0 ** -25).half().item() == 0.0
    p.grad = torch.tensor([float("inf"), 1.0], dtype=torch.float16)
    assert opt.unscale_(1.0).item() == 1


def test_next_scale_rule():
    s, good = 8.0, 0
    history = []
    for found in (False, False, True, False, False, False):
        s, good = next_scale(s, good, found, growth_interval=3)
        history.append((s, good))
    assert history == [(8, 1), (8, 2), (4, 0), (4, 1), (4, 2), (8, 0)]


def _grads(step, inf_steps):
    g = torch.linspace(-1, 1, 6).reshape(2, 3) * (step + 1)
    if step in inf_steps:
        g[0, 1] = float("inf") if step % 2 else float("nan")
    return g


def test_scaler_equals_torch_grad_scaler_on_cpu():
    """Same gradients (scaled by each scaler's own scale), same decisions: identical scale
    history, skipped steps and parameters; the pattern overflows, backs off and grows."""
    inf_steps = {2, 3, 9}
    kw = dict(growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
    ours_p, torch_p = nn.Parameter(torch.ones(2, 3)), nn.Parameter(torch.ones(2, 3))
    ours_opt = torch.optim.SGD([ours_p], lr=0.1)
    torch_opt = torch.optim.SGD([torch_p], lr=0.1)
    ours, theirs = DynamicLossScaler(2.0 ** 8, **kw), torch.amp.GradScaler("cpu", 2.0 ** 8, **kw)
    scales = []
    for step in range(14):
        theirs.scale(torch.ones(()))  # GradScaler makes its scale tensor on first use
        for p, s in ((ours_p, ours.scale_value), (torch_p, theirs.get_scale())):
            p.grad = _grads(step, inf_steps) * s
        assert ours.step(ours_opt) == (step not in inf_steps)
        theirs.step(torch_opt)
        ours.update()
        theirs.update()
        scales.append((ours.scale_value, theirs.get_scale()))
        assert torch.equal(ours_p, torch_p)
    assert all(a == b for a, b in scales)
    assert ours.skipped == sorted(inf_steps)
    assert len({s for s, _ in scales}) > 2  # it backed off and grew


def test_scaler_guards_the_usual_mistakes():
    p = nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([p], lr=0.1)
    scaler = DynamicLossScaler(4.0)
    p.grad = torch.ones(3) * 4
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="twice"):
        scaler.unscale_(opt)
    scaler.step(opt)  # uses the unscaled gradients: one step of lr·1
    assert torch.allclose(p, torch.full((3,), 0.9))
    scaler.update()
    with pytest.raises(RuntimeError, match="no step"):
        scaler.update()
    half = nn.Parameter(torch.ones(3, dtype=torch.bfloat16))
    half.grad = torch.ones(3, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="MasterWeightOptimizer"):
        scaler.unscale_(torch.optim.SGD([half], lr=0.1))
    for bad, match in ((dict(init_scale=0), "init_scale"), (dict(growth_factor=0.5), "growth"),
                       (dict(backoff_factor=2), "backoff"), (dict(growth_interval=0), "interval")):
        with pytest.raises(ValueError, match=match):
            DynamicLossScaler(**{"init_scale": 1.0, **bad})


def test_static_scale_skips_but_never_changes():
    p = nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=0.1)
    scaler = DynamicLossScaler(2.0 ** 12, growth_factor=1, backoff_factor=1, growth_interval=1)
    for step in range(4):
        p.grad = torch.full((2,), float("inf") if step == 1 else 2.0 ** 12)
        scaler.step(opt)
        scaler.update()
        assert scaler.scale_value == 2.0 ** 12
    assert scaler.skipped == [1] and torch.allclose(p, torch.full((2,), 0.7))


def test_disabled_scaler_is_plain_training():
    model = TinyGPT(CFG)
    twin = copy.deepcopy(model)
    x, y = _batch()
    a, b = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(twin.parameters(), lr=0.1)
    scaler = DynamicLossScaler(enabled=False)
    scaler.scale(model(x, y)[1]).backward()
    assert scaler.step(a) and scaler.scale_value == 1.0
    scaler.update()
    twin(x, y)[1].backward()
    b.step()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), twin.parameters()))


def test_master_weights_factory_composes():
    build = master_weights(torch.optim.Adam)
    p = nn.Parameter(torch.ones(3, dtype=torch.bfloat16))
    opt = build([p], lr=0.5)
    assert isinstance(opt, MasterWeightOptimizer) and isinstance(opt.optim, torch.optim.Adam)
    assert opt.param_groups[0]["lr"] == 0.5


def test_recorded_dtypes_of_tinygpt_under_cpu_autocast():
    model = TinyGPT(CFG)
    x, y = _batch()
    rows = record_op_dtypes(model, lambda: model(x, y)[1], autocast=torch.bfloat16)
    fwd = {(r.kind, r.op): r.output for r in rows if r.phase == "forward"}
    assert fwd[("Linear", "addmm")] == "bfloat16"                     # matmuls: lower precision
    assert fwd[("CausalSelfAttention", "bmm")] == "bfloat16"
    assert fwd[("CausalSelfAttention", "_softmax")] == "bfloat16"      # CPU: follows its input
    assert fwd[("LayerNorm", "native_layer_norm")] == "float32"        # its input is fp32 ...
    assert fwd[("Block", "add")] == "float32"                          # ... the residual stream
    assert fwd[("TinyGPT", "nll_loss_forward")] == "float32"           # the loss: fp32 list
    assert any(r.phase == "backward" and r.op == "mm" and r.output == "bfloat16" for r in rows)
    assert all(p.grad.dtype == torch.float32 for p in model.parameters())
    plain = record_op_dtypes(model, lambda: model(x, y)[1], backward=False)
    assert {r.output for r in plain} <= {"float32", ""}


def test_autocast_policy_on_cpu():
    assert autocast_policy(F.linear, torch.ones(3, 8)) == "lower precision"
    assert autocast_policy(F.cross_entropy, torch.zeros(4, dtype=torch.long)) == "fp32"
    assert autocast_policy(torch.softmax, dim=-1) == "input dtype"
    assert autocast_policy(F.layer_norm, (8,)) == "input dtype"
    assert autocast_policy(F.linear, torch.ones(3, 8), dtype=torch.float16) == "lower precision"
