"""toolkit.data_parallel.powersgd on 2-4 gloo ranks: the course's hook on the course's DDPs and
on torch's, against Vogels et al.'s Algorithms 1-2 written out in one process; exactness when
the mean gradient has rank <= r; what error feedback keeps; recorded bytes against
r·(n + m) per matrix; torch's powerSGD_hook run in order on gloo.

The reference sees every rank's gradient of a step, starts each matrix's power iteration from
the same random Q as the hook (`PowerSGDState.initial_q`, given the bucket layout of the pure
`assign_buckets`), orthogonalises with Householder QR (not Gram-Schmidt: P̂·Qᵀ does not depend
on the signs of P̂'s columns), and steps a single copy of the model.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_powersgd
from torch.nn.parallel import DistributedDataParallel

from toolkit import comm
from toolkit.cost.traffic import compresses, matrix_shape, powersgd_elements
from toolkit.data_parallel.buckets import assign_buckets, bucket_cap_bytes
from toolkit.data_parallel.ddp import BucketedDDP, OverlappedDDP
from toolkit.data_parallel.powersgd import (
    PowerSGDState, in_order, orthogonalize, power_step, powersgd_hook,
)
from toolkit.launch import spawn
from toolkit.models import GPTConfig, TinyGPT, TinyMLP, make_regression_data, make_token_data

pytestmark = pytest.mark.multirank
TIMEOUT = 120
GPT = GPTConfig(vocab_size=16, seq_len=6, d_model=16, n_head=2, n_layer=1, d_ff=24)
CAP_MB = 0.001          # ~1 KB buckets: several per model, some with several tensors
LR, BATCH = 0.1, 4


def _model(kind):
    if kind == "mlp":
        return TinyMLP(d_in=12, d_hidden=20, d_out=3, depth=2, seed=1)
    return TinyGPT(GPT)


def _data(kind, n=256):
    if kind == "mlp":
        return make_regression_data(n, 12, 3, seed=5)
    return make_token_data(n, GPT.seq_len, GPT.vocab_size, seed=5)


def _loss(kind, model, x, y):
    return F.mse_loss(model(x), y) if kind == "mlp" else model(x, y)[1]


def _items(step, rank, world_size):
    start = (step * world_size + rank) * BATCH
    return slice(start, start + BATCH)


def _train(rank, world_size, kind, ddp_kind, r, steps, start_iter):
    x, y = _data(kind)
    model = _model(kind)
    ddp = (BucketedDDP if ddp_kind == "bucketed" else OverlappedDDP)(model, bucket_cap_mb=CAP_MB)
    # epsilon 0, as QR: the attention's q and k gradients start tiny, and a column norm of
    # 1e-7 plus the default epsilon 1e-8 is a 10 % different scale.
    state = PowerSGDState(matrix_rank=r, start_iter=start_iter, epsilon=0.0)
    ddp.register_comm_hook(state, powersgd_hook)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    sent = []
    for step in range(steps):
        opt.zero_grad()
        with comm.recording() as trace:
            _loss(kind, ddp, x[_items(step, rank, world_size)],
                  y[_items(step, rank, world_size)]).backward()
        sent.append(sum(e.nbytes for e in trace.where(op="all_reduce")))
        opt.step()
    return [p.detach().clone() for p in model.parameters()], sent, len(ddp.buckets)


def _reference(kind, world_size, r, steps, start_iter):
    x, y = _data(kind)
    model = _model(kind)
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=LR, momentum=0.9)
    buckets = assign_buckets(params, bucket_cap_bytes(CAP_MB))
    state = PowerSGDState(matrix_rank=r)          # only for initial_q
    errors = [[torch.zeros(sum(params[j].numel() for j in b)) for b in buckets]
              for _ in range(world_size)]
    warm: dict = {}
    for step in range(steps):
        grads = []                                # grads[rank][param index]
        for rank in range(world_size):
            model.zero_grad()
            _loss(kind, model, x[_items(step, rank, world_size)],
                  y[_items(step, rank, world_size)]).backward()
            grads.append([p.grad.clone() for p in params])
        for b, members in enumerate(buckets):
            if step < start_iter:
                for j in members:
                    params[j].grad = sum(g[j] for g in grads) / world_size
                continue
            # Δᵢ = gᵢ + eᵢ, flat over the bucket, in bucket order
            deltas = [torch.cat([grads[i][j].reshape(-1) for j in members]) + errors[i][b]
                      for i in range(world_size)]
            applied = torch.zeros_like(deltas[0])
            offset, position = 0, 0
            for j in members:
                numel, shape = params[j].numel(), params[j].shape
                piece = slice(offset, offset + numel)
                nm = matrix_shape(shape)
                if nm is not None and compresses(*nm, r):
                    ms = [d[piece].view(nm) for d in deltas]
                    q = warm.get((b, j))
                    if q is None:
                        q = state.initial_q(nm[1], min(r, *nm), step=step, position=position,
                                            like=deltas[0])
                    p_hat = torch.linalg.qr(sum(m @ q for m in ms) / world_size).Q
                    q = sum(m.t() @ p_hat for m in ms) / world_size
                    warm[(b, j)] = q
                    applied[piece] = (p_hat @ q.t()).reshape(-1)
                    position += 1
                else:
                    applied[piece] = sum(d[piece] for d in deltas) / world_size
                offset += numel
            for i in range(world_size):
                errors[i][b] = deltas[i] - applied
            offset = 0
            for j in members:
                params[j].grad = applied[offset: offset + params[j].numel()].view_as(params[j])
                offset += params[j].numel()
        opt.step()
    return [p.detach().clone() for p in params]


@pytest.mark.parametrize("kind, ddp_kind, world_size, r", [
    ("mlp", "bucketed", 3, 2), ("gpt", "overlapped", 3, 2), ("gpt", "bucketed", 2, 1),
])
def test_course_hook_matches_algorithms_1_and_2(kind, ddp_kind, world_size, r):
    steps, start_iter = 5, 1
    ref = _reference(kind, world_size, r, steps, start_iter)
    results = spawn(_train, world_size, kind, ddp_kind, r, steps, start_iter, timeout=TIMEOUT,
                    echo=False)
    shapes = [tuple(p.shape) for p in _model(kind).parameters()]
    volume = powersgd_elements(shapes, r)
    assert 0 < volume.p and volume.total < volume.dense
    for rank, (params, sent, n_buckets) in enumerate(results):
        for i, (a, b) in enumerate(zip(params, ref)):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=f"rank {rank} param {i}")
        assert n_buckets > 1
        # Dense until start_iter, then exactly r·(n + m) per compressed matrix + the rest.
        assert sent == [4 * volume.dense] * start_iter + [4 * volume.total] * (steps - start_iter)
    for params, _, _ in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(params, results[0][0]))


def _one_item_grads(rank, world_size, ddp_kind, r):
    # One item per rank: every Linear weight's gradient is an outer product (rank 1), so the
    # mean over p ranks has rank <= p, and PowerSGD at r = p loses nothing.
    x, y = make_regression_data(world_size, 12, 3, seed=7)
    model = TinyMLP(d_in=12, d_hidden=20, d_out=3, depth=2, seed=1)
    state = PowerSGDState(matrix_rank=r, error_feedback=False, start_iter=1)
    if ddp_kind == "torch":
        ddp = DistributedDataParallel(model, bucket_cap_mb=CAP_MB)
    else:
        ddp = OverlappedDDP(model, bucket_cap_mb=CAP_MB)
    ddp.register_comm_hook(state, powersgd_hook)
    grads = []
    for _ in range(3):      # torch's DDP rebuilds its buckets after the first backward
        model.zero_grad()
        F.mse_loss(ddp(x[rank:rank + 1]), y[rank:rank + 1]).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    return grads


@pytest.mark.parametrize("ddp_kind, world_size", [("course", 2), ("torch", 3)])
def test_exact_when_the_mean_gradient_has_rank_at_most_r(ddp_kind, world_size):
    results = spawn(_one_item_grads, world_size, ddp_kind, world_size, timeout=TIMEOUT,
                    echo=False)
    x, y = make_regression_data(world_size, 12, 3, seed=7)
    model = TinyMLP(d_in=12, d_hidden=20, d_out=3, depth=2, seed=1)
    F.mse_loss(model(x), y).backward()          # the mean over the p items, in one process
    shapes = [tuple(p.shape) for p in model.parameters()]
    assert powersgd_elements(shapes, world_size).p > 0      # something was compressed
    for grads in results:
        for step_grads in grads[1:]:            # compressed from the second backward on
            for a, p in zip(step_grads, model.parameters()):
                torch.testing.assert_close(a, p.grad, rtol=1e-4, atol=1e-6)


def _error_feedback(rank, world_size):
    # lr = 0: every step sees the same gradient gᵢ; then Σ_t applied_t + eᵢ = T·gᵢ exactly.
    x, y = make_regression_data(8, 12, 3, seed=rank)
    model = TinyMLP(d_in=12, d_hidden=20, d_out=3, depth=2, seed=1)
    ddp = OverlappedDDP(model, bucket_cap_mb=1.0)       # one bucket
    state = PowerSGDState(matrix_rank=1)
    ddp.register_comm_hook(state, powersgd_hook)
    raw = torch.cat([g.reshape(-1) for g in reversed(torch.autograd.grad(
        F.mse_loss(model(x), y), list(model.parameters())))])    # bucket order: reversed
    applied = torch.zeros_like(raw)
    steps = 6
    for _ in range(steps):
        model.zero_grad()
        F.mse_loss(ddp(x), y).backward()
        applied += torch.cat([p.grad.reshape(-1) for p in reversed(list(model.parameters()))])
    (error,) = state.errors.values()
    return raw, applied, error, steps


def test_error_feedback_keeps_what_compression_dropped():
    results = spawn(_error_feedback, 2, timeout=TIMEOUT, echo=False)
    for raw, applied, error, steps in results:
        torch.testing.assert_close(applied + error, steps * raw, rtol=1e-4, atol=1e-5)
        assert error.abs().max() > 1e-4          # rank 1 really dropped something each step
    torch.testing.assert_close(results[0][1], results[1][1])   # one applied update for all


def _torch_ddp(rank, world_size, hook):
    x, y = _data("gpt")
    model = _model("gpt")
    ddp = DistributedDataParallel(model, bucket_cap_mb=CAP_MB)
    if hook == "torch":
        state = torch_powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=2,
                                             start_powerSGD_iter=2)
        ddp.register_comm_hook(state, in_order(torch_powersgd.powerSGD_hook))
    else:
        ddp.register_comm_hook(PowerSGDState(matrix_rank=2, start_iter=2), powersgd_hook)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    sent, calls = [], []
    for step in range(5):
        opt.zero_grad()
        with comm.recording() as trace:
            _loss("gpt", ddp, x[_items(step, rank, world_size)],
                  y[_items(step, rank, world_size)]).backward()
        reduces = trace.where(op="all_reduce")
        sent.append(sum(e.nbytes for e in reduces))
        calls.append(len(reduces))
        opt.step()
    return [p.detach().clone() for p in model.parameters()], sent, calls


@pytest.mark.parametrize("hook", ["torch", "course"])
def test_hooks_on_torch_ddp_with_several_buckets(hook):
    """torch's hook (made to run in order) and the course's on torch's DDP, 4 ranks: they
    finish, the replicas agree, and each step sends r·(n + m) per compressed matrix."""
    results = spawn(_torch_ddp, 4, hook, timeout=TIMEOUT, echo=False)
    volume = powersgd_elements([tuple(p.shape) for p in _model("gpt").parameters()], 2)
    for params, sent, calls in results:
        assert all(torch.equal(a, b) for a, b in zip(params, results[0][0]))
        assert sent == [4 * volume.dense] * 2 + [4 * volume.total] * 3
        # torch's DDP (2.13) reduces the first step in one bucket, then rebuilds its buckets:
        # several from step 2 (one plain all-reduce each), the case where torch's hook, not
        # made to run in order, hangs on gloo. Then each bucket sends P, Q (and the rest).
        assert calls[1] >= 2 and calls[2] >= 2 * calls[1] and calls[2:] == [calls[2]] * 3


def test_orthogonalize_and_power_step():
    gen = torch.Generator().manual_seed(0)
    p = torch.randn(10, 3, generator=gen)
    q = orthogonalize(p.clone())
    torch.testing.assert_close(q.t() @ q, torch.eye(3), atol=1e-6, rtol=0)
    # the columns span what p's did
    torch.testing.assert_close(q @ (q.t() @ p), p, atol=1e-5, rtol=1e-5)
    zero = orthogonalize(torch.zeros(5, 2))
    assert torch.equal(zero, torch.zeros(5, 2))
    u, v = torch.randn(8, 1, generator=gen), torch.randn(6, 1, generator=gen)
    m = u @ v.t()                                 # rank 1: one step recovers it exactly
    p_hat, q_new = power_step(m, torch.randn(6, 1, generator=gen))
    torch.testing.assert_close(p_hat @ q_new.t(), m, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="matrix"):
        power_step(m, torch.randn(5, 1))


def test_powersgd_volume_by_hand():
    # (64, 32) at r = 2: 2·96·2 = 384 < 2048, compressed: P 128, Q 64; the vector as is;
    # (4, 64): 2·68·2 = 272 >= 256, not worth it: sent as is.
    v = powersgd_elements([(64, 32), (64,), (4, 64)], 2)
    assert (v.p, v.q, v.uncompressed, v.dense) == (128, 64, 64 + 256, 2048 + 64 + 256)
    assert v.total == 512 and v.ratio == pytest.approx(2368 / 512)
    assert matrix_shape((4, 3, 2)) == (4, 6) and matrix_shape((7,)) is None
    assert compresses(100, 100, 1) and not compresses(3, 3, 1)
    assert powersgd_elements([(32, 8)], 8).uncompressed == 256   # r >= what pays: as is


def test_state_is_validated():
    with pytest.raises(ValueError, match="matrix_rank"):
        PowerSGDState(matrix_rank=0)
    with pytest.raises(ValueError, match="start_iter"):
        PowerSGDState(start_iter=-1)
    with pytest.raises(ValueError, match="min_compression_rate"):
        PowerSGDState(min_compression_rate=0)


def _register_twice(rank, world_size):
    ddp = BucketedDDP(TinyMLP(seed=0))
    out = []
    for hook in ("not callable", powersgd_hook, powersgd_hook):
        try:
            ddp.register_comm_hook(PowerSGDState(), hook)
            out.append("ok")
        except (TypeError, RuntimeError) as err:
            out.append(type(err).__name__)
    return out


def test_course_ddp_register_comm_hook_is_checked():
    assert spawn(_register_twice, 2, timeout=TIMEOUT, echo=False)[0] == [
        "TypeError", "ok", "RuntimeError"]
