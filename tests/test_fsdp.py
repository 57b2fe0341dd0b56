"""toolkit.data_parallel.fsdp: ZeRO-3 equals single-process training (tied head, frozen
parameters, sizes not divisible by the world size, prefetch, bf16 compute), holds 16Ψ/N_d-style
bytes at rest, and communicates two all-gathers and one reduce-scatter per unit and step."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from toolkit import comm
from toolkit import memory as M
from toolkit.data_parallel.fsdp import FullyShardedDataParallel as FSDP
from toolkit.launch import spawn
from toolkit.models import GPTConfig, TinyGPT, TinyMLP, make_regression_data, make_token_data

pytestmark = pytest.mark.multirank
TIMEOUT = 60
STEPS = 3
BATCH = 8
CFG = GPTConfig(vocab_size=37, seq_len=8, d_model=20, n_head=2, n_layer=3)
MLP = dict(d_in=7, d_hidden=10, d_out=3, depth=2)
SGD = (torch.optim.SGD, dict(lr=0.2, momentum=0.9))
ADAM = (torch.optim.AdamW, dict(lr=1e-2))
# SGD: only the rounding of cross-rank sums differs. Adam: a near-zero gradient still moves a
# parameter by ~lr, so that rounding can show at ~1e-5 (see tests/test_zero.py).
TOL = {torch.optim.SGD: dict(rtol=1e-5, atol=1e-6), torch.optim.AdamW: dict(rtol=1e-4, atol=3e-5)}


def _model(kind: str):
    if kind == "mlp":
        return TinyMLP(**MLP)
    model = TinyGPT(CFG)
    if kind == "gpt-frozen":
        model.pos_emb.weight.requires_grad_(False)      # root: a frozen group beside a trainable
        model.blocks[1].ln_1.weight.requires_grad_(False)  # a unit with a frozen group
        for p in model.blocks[2].attn.parameters():
            p.requires_grad_(False)
    return model


def _loss(kind, model, rank, world):
    n = BATCH // world
    lo, hi = rank * n, (rank + 1) * n
    if kind == "mlp":
        x, y = make_regression_data(BATCH, MLP["d_in"], MLP["d_out"])
        return F.mse_loss(model(x[lo:hi]), y[lo:hi])
    x, y = make_token_data(BATCH, CFG.seq_len, CFG.vocab_size)
    return model(x[lo:hi], y[lo:hi])[1]


def _reference(kind, optimizer, opts):
    model = _model(kind)
    opt = optimizer([p for p in model.parameters() if p.requires_grad], **opts)
    for _ in range(STEPS):
        opt.zero_grad()
        _loss(kind, model, 0, 1).backward()
        opt.step()
    return model.state_dict()


def _fsdp(rank, world, kind, optimizer, opts, prefetch, dtype):
    model = FSDP(_model(kind), prefetch=prefetch, compute_dtype=dtype)
    opt = optimizer([p for p in model.parameters() if p.requires_grad], **opts)
    with comm.recording() as trace:
        for _ in range(STEPS):
            opt.zero_grad()
            _loss(kind, model, rank, world).backward()
            opt.step()
    held = M.held_model_states(model, opt)
    groups = [(g.numel, g.trainable) for g in model._all_groups()]
    at_rest = sum(t.untyped_storage().nbytes() for t in model.unsharded_tensors())
    events = [(e.op, e.nbytes, e.dtype, e.async_op) for e in trace.events]
    return model.full_state_dict(), held, groups, at_rest, events, [
        p.dtype for p in model.parameters()]


@pytest.mark.parametrize("world", [2, 4])
def test_fp32_matches_single_process(world):
    for kind in ("mlp", "gpt", "gpt-frozen"):
        for (optimizer, opts), prefetch in ((SGD, False), (ADAM, True)):
            want = _reference(kind, optimizer, opts)
            results = spawn(_fsdp, world, kind, optimizer, opts, prefetch, None,
                            timeout=TIMEOUT, echo=False)
            for state, held, groups, at_rest, events, _dtypes in results:
                assert state.keys() == want.keys()  # both names of the tied weight
                for name in want:
                    torch.testing.assert_close(state[name], want[name], **TOL[optimizer],
                                               msg=lambda m, k=kind, n=name: f"{k} {n}: {m}")
                assert at_rest == 0  # every gathered buffer freed between steps
                # Memory at rest: each flat group holds its padded 1/N_d share of every state.
                want_params = sum(4 * M.shard_numel(n, world) for n, _ in groups)
                state_per_elem = 4 + (8 if optimizer is torch.optim.AdamW else 4)
                want_rest = sum(state_per_elem * M.shard_numel(n, world) for n, t in groups if t)
                assert held.params == want_params
                assert held.grads + held.optimizer == want_rest
                if prefetch:
                    assert any(async_op for op, *_, async_op in events if op.startswith("all_g"))
            if kind == "gpt-frozen":
                assert torch.equal(state["pos_emb.weight"], TinyGPT(CFG).pos_emb.weight)


def test_traffic_per_step_is_two_gathers_and_one_reduce_scatter_per_unit():
    world = 2
    (_, _, groups, _, events, _), _ = spawn(_fsdp, world, "mlp", *SGD, False, None,
                                            timeout=TIMEOUT, echo=False)
    # TinyMLP: every Linear is a unit, the root is empty; all groups trainable.
    assert all(t for _, t in groups) and len(groups) == 3
    calls = Counter(op for op, *_ in events)
    assert calls == {"all_gather_into_tensor": 2 * 3 * STEPS, "reduce_scatter_tensor": 3 * STEPS}
    gathered = sum(n for op, n, *_ in events if op == "all_gather_into_tensor") // STEPS
    scattered = sum(n for op, n, *_ in events if op == "reduce_scatter_tensor") // STEPS
    padded = sum(world * M.shard_numel(n, world) for n, _ in groups)
    # The recorder counts what a rank passes in: its shard to an all-gather, the full
    # gradient to a reduce-scatter.
    assert gathered == 2 * 4 * padded // world and scattered == 4 * padded


def test_bf16_compute_with_fp32_master_shards():
    want = _reference("gpt", *ADAM)
    results = spawn(_fsdp, 2, "gpt", *ADAM, True, torch.bfloat16, timeout=TIMEOUT, echo=False)
    for state, _held, _groups, at_rest, events, dtypes in results:
        assert set(dtypes) == {torch.float32}  # master shards and optimizer stay fp32
        assert {d for op, _, d, _ in events if op == "all_gather_into_tensor"} == {"bfloat16"}
        assert {d for op, _, d, _ in events if op == "reduce_scatter_tensor"} == {"float32"}
        for name in want:  # bf16 has 8 bits of mantissa: close, not equal
            torch.testing.assert_close(state[name], want[name], rtol=0.05, atol=0.05)
        assert at_rest == 0


def _eval_and_load(rank, world):
    model = FSDP(TinyGPT(CFG))
    x, _ = make_token_data(4, CFG.seq_len, CFG.vocab_size)
    with torch.no_grad():
        logits, _ = model(x)
    at_rest = sum(t.untyped_storage().nbytes() for t in model.unsharded_tensors())
    plain = TinyGPT(CFG)
    plain.load_state_dict(model.full_state_dict())  # strict: every name present
    return logits, plain(x)[0], at_rest, len(list(model.module.parameters()))


def test_eval_forward_state_dict_and_no_original_parameters_left():
    for logits, plain_logits, at_rest, leftover in spawn(_eval_and_load, 2, timeout=TIMEOUT,
                                                         echo=False):
        torch.testing.assert_close(logits, plain_logits)
        torch.testing.assert_close(logits, TinyGPT(CFG)(make_token_data(
            4, CFG.seq_len, CFG.vocab_size)[0])[0])
        assert at_rest == 0 and leftover == 0


def test_errors():
    with pytest.raises(RuntimeError, match="not initialised"):
        FSDP(TinyMLP())


def _accumulate(rank, world, units_mode):
    base = TinyMLP(**MLP)
    units = [] if units_mode == "root-only" else None  # [] puts every parameter in the root
    model = FSDP(base, units)
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    x, y = make_regression_data(BATCH, MLP["d_in"], MLP["d_out"])
    n = BATCH // world
    mine_x, mine_y = x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]
    half = n // 2
    for lo, hi in ((0, half), (half, n)):  # two micro-batches, one step
        (F.mse_loss(model(mine_x[lo:hi]), mine_y[lo:hi]) / 2).backward()
    opt.step()
    return model.full_state_dict(), len(model.unit_groups), len(model.root_groups)


@pytest.mark.parametrize("units_mode", ["default", "root-only"])
def test_gradient_accumulation_and_root_only(units_mode):
    reference = TinyMLP(**MLP)
    x, y = make_regression_data(BATCH, MLP["d_in"], MLP["d_out"])
    F.mse_loss(reference(x), y).backward()
    torch.optim.SGD(reference.parameters(), lr=0.2).step()
    for state, n_units, n_root in spawn(_accumulate, 2, units_mode, timeout=TIMEOUT,
                                        echo=False):
        assert (n_units, n_root) == ((3, 0) if units_mode == "default" else (0, 1))
        for name, value in reference.state_dict().items():
            torch.testing.assert_close(state[name], value, rtol=1e-5, atol=1e-6)


def test_torch_fsdp2_holds_its_predicted_bytes():
    from toolkit.experiments.memory import predicted_rows, run_methods

    rows = predicted_rows(run_methods(2, ("fsdp", "torch_fsdp2"), steps=1))
    for part in ("params", "grads", "optimizer"):
        assert (rows[part] == rows[f"padded_{part}"]).all(), part
    # Both shard Ψ over 2 ranks: within 2 % of 16Ψ/N_d, whatever the padding scheme.
    assert ((rows.measured_total / rows.pred_total - 1).abs() < 0.02).all()


def _states(rank, world_size):
    """Each group's state at the points of a step where the design says what it must be."""
    from toolkit.data_parallel.fsdp import State

    model = FSDP(TinyGPT(CFG), prefetch=True)
    units = model.unit_groups

    def states(groups):
        return [g.state.value for g in groups]

    seen = {"start": states(model._all_groups())}

    def note(key, groups):
        def hook(module, args, out):  # registered after FSDP's own hooks on the unit
            seen.setdefault(key, states(groups))
        return hook

    model.module.blocks[0].register_forward_hook(note("after block 0", units[0] + units[1]))
    model.module.blocks[2].register_forward_hook(note("root in forward", model.root_groups))
    loss = _loss("gpt", model, rank, world_size)
    seen["after forward"] = states(sum(units, [])), states(model.root_groups)
    loss.backward()
    seen["after backward"] = states(model._all_groups())
    # Using a freed group, or a buffer freed behind the group's back, is caught, not used.
    g = units[0][0]
    for key in ("install freed", "storage gone"):
        try:
            g.install()
            seen[key] = "not caught"
        except AssertionError as exc:
            seen[key] = str(exc)
        g.gather()
        assert g.state is State.GATHERED
        g.full.untyped_storage().resize_(0)
    return seen


def test_group_state_is_explicit_and_follows_the_step():
    seen = spawn(_states, 2, timeout=TIMEOUT)[0]
    assert set(seen["start"]) == {"freed"}
    # Block 0 freed as soon as its forward returned; block 1 prefetched (all-gather in flight).
    assert seen["after block 0"] == ["freed", "in flight"]
    assert set(seen["root in forward"]) == {"gathered"}      # kept for the whole forward
    in_units, in_root = seen["after forward"]
    assert set(in_units) == {"freed"} and set(in_root) == {"gathered"}
    assert set(seen["after backward"]) == {"freed"}
    assert seen["install freed"].startswith("FlatGroup is freed, expected")
    assert seen["storage gone"].startswith("FlatGroup gathered holds 0 bytes of its")
