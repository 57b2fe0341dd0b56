"""toolkit.data_parallel.zero: ZeRO-1/2 equal single-process training, hold the bytes
toolkit.memory predicts, and communicate with the collectives of ZeRO §5.

Ranks train on their slice of the batch; the reference trains on the whole batch in this process.
Each launch checks several things, so the file runs in a few seconds.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from toolkit import comm
from toolkit import memory as M
from toolkit.data_parallel.fsdp_schedule import ring_wire_bytes
from toolkit.data_parallel.zero import ShardedOptimizer
from toolkit.launch import spawn
from toolkit.models import (
    GPTConfig, TinyGPT, TinyMLP, count_parameters, make_regression_data, make_token_data,
)

pytestmark = pytest.mark.multirank
TIMEOUT = 60
STEPS = 3
BATCH = 8
MLP = dict(d_in=7, d_hidden=10, d_out=3)  # 223 parameters: not divisible by 2 or 4
CFG = GPTConfig(vocab_size=37, seq_len=8, d_model=20, n_head=2, n_layer=2)  # tied head


def _mlp_run(model, opt_step, x, y, rank, world):
    n = len(x) // world
    xs, ys = x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]
    for _ in range(STEPS):
        opt_step(lambda: F.mse_loss(model(xs), ys))


def _gpt(frozen: bool) -> TinyGPT:
    model = TinyGPT(CFG)
    if frozen:
        model.pos_emb.weight.requires_grad_(False)
        model.blocks[0].mlp.up_proj.bias.requires_grad_(False)
    return model


def _train(model, opt, loss_fn):
    for _ in range(STEPS):
        opt.zero_grad()
        loss_fn().backward()
        opt.step()


def _reference(kind: str, optimizer, **opts):
    if kind == "mlp":
        model = TinyMLP(**MLP)
        x, y = make_regression_data(BATCH, MLP["d_in"], MLP["d_out"])
        loss = lambda: F.mse_loss(model(x), y)  # noqa: E731
    else:
        model = _gpt(kind == "gpt-frozen")
        x, y = make_token_data(BATCH, CFG.seq_len, CFG.vocab_size)
        loss = lambda: model(x, y)[1]  # noqa: E731
    _train(model, optimizer(model.parameters(), **opts), loss)
    return [p.detach().clone() for p in model.parameters()]


def _sharded(rank, world, kind, stage, optimizer, opts, reduce="reduce_scatter"):
    n = BATCH // world
    if kind == "mlp":
        model = TinyMLP(**MLP)
        x, y = make_regression_data(BATCH, MLP["d_in"], MLP["d_out"])
        xs, ys = x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]
        loss = lambda: F.mse_loss(model(xs), ys)  # noqa: E731
    else:
        model = _gpt(kind == "gpt-frozen")
        x, y = make_token_data(BATCH, CFG.seq_len, CFG.vocab_size)
        loss = lambda: model(x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n])[1]  # noqa
    opt = ShardedOptimizer(model.parameters(), optimizer, stage=stage, reduce=reduce, **opts)
    with comm.recording() as trace:
        _train(model, opt, loss)
    held = M.held_model_states(model, opt)
    return ([p.detach().clone() for p in model.parameters()], held,
            [(e.op, e.nbytes) for e in trace.events])


CASES = [(torch.optim.Adam, dict(lr=1e-2)), (torch.optim.SGD, dict(lr=0.2, momentum=0.9))]
# SGD is linear in the gradient: only float rounding of the cross-rank sums differs (~1e-7).
# Adam divides by sqrt(v): for a near-zero gradient (LayerNorm biases of TinyGPT) the update is
# about ±lr whatever its size, so rounding moves it by up to ~1e-5 after 3 steps at lr 1e-2.
TOLERANCE = {torch.optim.SGD: dict(rtol=1e-5, atol=1e-6),
             torch.optim.Adam: dict(rtol=1e-4, atol=3e-5)}


# Stage 1 reduce-scatters (2Ψ per step, as stage 2); its naive variant all-reduces (3Ψ).
VARIANTS = [(1, "reduce_scatter", 2), (1, "all_reduce", 3), (2, "reduce_scatter", 2)]


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("stage, reduce, volume", VARIANTS)
def test_matches_single_process_and_memory_math(world, stage, reduce, volume):
    for kind in ("mlp", "gpt", "gpt-frozen"):
        for optimizer, opts in CASES:
            want = _reference(kind, optimizer, **opts)
            results = spawn(_sharded, world, kind, stage, optimizer, opts, reduce,
                            timeout=TIMEOUT, echo=False)
            for params, _held, _events in results:
                for got, ref in zip(params, want):
                    torch.testing.assert_close(got, ref, **TOLERANCE[optimizer])
            if kind == "gpt-frozen":
                continue
            model = TinyMLP(**MLP) if kind == "mlp" else TinyGPT(CFG)
            P = count_parameters(model)
            S = M.shard_numel(P, world)
            recipe = M.FP32_ADAM if optimizer is torch.optim.Adam else M.SGD_MOMENTUM
            want_bytes = M.model_state_bytes(P, world, stage, recipe, padded=True)
            for _, held, events in results:
                assert (held.params, held.grads, held.optimizer) == (
                    want_bytes.params, want_bytes.grads, want_bytes.optimizer)
                assert held.step_bytes == (4 if optimizer is torch.optim.Adam else 0)
                first = "all_reduce" if reduce == "all_reduce" else "reduce_scatter_tensor"
                # Per step: the full padded gradient in, then my shard into the all-gather.
                assert events == [(first, 4 * world * S), ("all_gather_into_tensor", 4 * S)] * STEPS
                # As a ring moves them: volume × (N-1)/N × the padded Ψ, in fp32 bytes.
                sent = sum(ring_wire_bytes(op, n, world) for op, n in events) / STEPS
                assert sent == volume * (world - 1) * S * 4


def _hyper(rank, world):
    model = TinyMLP(**MLP)
    opt = ShardedOptimizer(model.parameters(), torch.optim.SGD, stage=2, lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    x, y = make_regression_data(4, MLP["d_in"], MLP["d_out"])
    opt.param_groups[0]["lr"] = 0.0  # what a learning-rate scheduler does
    F.mse_loss(model(x), y).backward()
    opt.step()
    same = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    views = len({p.untyped_storage().data_ptr() for p in model.parameters()})
    return same, views, opt.flats[0].padding


def test_scheduler_lr_reaches_inner_optimizer_and_params_share_one_buffer():
    for same, views, padding in spawn(_hyper, 3, timeout=TIMEOUT, echo=False):
        assert same and views == 1 and padding == 3 * M.shard_numel(223, 3) - 223 == 2


def _zero_grad_modes(rank, world, stage, reduce):
    """Steps with zero_grad(set_to_none=True), then False, then none at all (accumulation),
    against single-process SGD doing the same; .grad and held bytes after each kind."""
    model = TinyMLP(**MLP)
    opt = ShardedOptimizer(model.parameters(), torch.optim.SGD, stage=stage, reduce=reduce,
                           lr=0.1)
    x, y = make_regression_data(BATCH, MLP["d_in"], MLP["d_out"])
    n = BATCH // world
    xs, ys = x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]
    seen = {}
    for mode in (True, False, "skip"):
        if mode != "skip":
            opt.zero_grad(set_to_none=mode)
            grads = [p.grad for p in model.parameters()] + [opt.optim.param_groups[0][
                "params"][0].grad]
            seen[mode] = (["none" if g is None else "zero" if not g.any() else "other"
                           for g in grads], M.storage_bytes(grads))
        F.mse_loss(model(xs), ys).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()], seen


@pytest.mark.parametrize("stage, reduce", [(1, "reduce_scatter"), (1, "all_reduce"),
                                           (2, "reduce_scatter")])
def test_zero_grad_set_to_none_is_honoured(stage, reduce):
    reference = TinyMLP(**MLP)
    ref = torch.optim.SGD(reference.parameters(), lr=0.1)
    x, y = make_regression_data(BATCH, MLP["d_in"], MLP["d_out"])
    for mode in (True, False, "skip"):
        if mode != "skip":
            ref.zero_grad(set_to_none=mode)
        F.mse_loss(reference(x), y).backward()
        ref.step()
    S = M.shard_numel(count_parameters(reference), 2)
    for params, seen in spawn(_zero_grad_modes, 2, stage, reduce, timeout=TIMEOUT, echo=False):
        for got, want in zip(params, reference.parameters()):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        kinds, held = seen[True]
        assert set(kinds) == {"none"} and held == 0  # stage 1's flat buffer is freed too
        kinds, held = seen[False]
        if stage == 1:  # every .grad a zeroed window on the kept flat buffer
            assert set(kinds[:-1]) == {"zero"} and held == 4 * 2 * S
        else:  # stage 2 had dropped the full gradients in step; its shard gradient is zeroed
            assert set(kinds[:-1]) == {"none"} and kinds[-1] == "zero" and held == 4 * S


def test_errors():
    with pytest.raises(ValueError, match="stage must be 1 or 2"):
        ShardedOptimizer(TinyMLP().parameters(), torch.optim.SGD, stage=3, lr=0.1)
    with pytest.raises(ValueError, match="all_reduce only at stage 1"):
        ShardedOptimizer(TinyMLP().parameters(), torch.optim.SGD, stage=2, reduce="all_reduce",
                         lr=0.1)
    with pytest.raises(RuntimeError, match="not initialised"):
        ShardedOptimizer(TinyMLP().parameters(), torch.optim.SGD, stage=1, lr=0.1)
