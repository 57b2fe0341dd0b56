"""toolkit.precision on 2-4 gloo ranks: the bf16 gradient all-reduce (half the bytes of fp32,
the mean it should be), the data-parallel step against a float64 single-process reference,
overflow injected on one rank only (every rank skips exactly that step), a resume from state
dicts, ZeRO-1/2 with fp32 masters, FSDP's reduce and shard dtypes, and mixed-precision bytes
per rank equal to toolkit.memory to the byte.

Tolerances (measured, then given headroom): a bf16 run rounds weights, activations and
gradients to 8 significant bits, so over 6 steps its mean loss stays within 1 % of float64 and
its fp32 masters within 2·10^-2 with SGD (observed ≤ 6.5·10^-3); the same step in fp32 agrees
to 10^-5 (observed ≤ 2·10^-7), which checks the algorithm itself."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from toolkit import comm
from toolkit import memory as M
from toolkit.data_parallel.fsdp import FullyShardedDataParallel as FSDP
from toolkit.data_parallel.zero import ShardedOptimizer
from toolkit.launch import device, spawn
from toolkit.models import GPTConfig, TinyGPT, count_parameters, make_token_data
from toolkit.precision import (
    DynamicLossScaler, MasterWeightOptimizer, all_reduce_gradients, data_parallel_step,
    master_weights,
)

pytestmark = pytest.mark.multirank
TIMEOUT = 60
CFG = GPTConfig(vocab_size=37, seq_len=8, d_model=20, n_head=2, n_layer=2)
BATCH, STEPS = 8, 6
SGD = (torch.optim.SGD, dict(lr=0.3, momentum=0.9))


def _slice(rank, world):
    x, y = make_token_data(BATCH, CFG.seq_len, CFG.vocab_size, device=device())
    n = BATCH // world
    return x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]


def _reduce(rank, world, dtypes):
    """One backward, then its bf16 gradients all-reduced once per dtype of `dtypes` (each
    from the same local gradients): {dtype: (events, local, reduced)}."""
    model = TinyGPT(CFG, device=device()).to(torch.bfloat16)
    model.pos_emb.weight.requires_grad_(False)  # frozen: not on the wire
    xs, ys = _slice(rank, world)
    model(xs, ys)[1].backward()
    trainable = [p for p in model.parameters() if p.requires_grad]
    grads = [p.grad.clone() for p in trainable]
    out = {}
    for dtype in dtypes:
        for p, g in zip(trainable, grads):
            p.grad = g.clone()
        with comm.recording() as trace:
            all_reduce_gradients(model.parameters(), dtype=dtype)
        out[dtype] = ([(e.op, e.nbytes, e.dtype) for e in trace.events],
                      [g.float() for g in grads], [p.grad.float() for p in trainable])
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_bf16_all_reduce_sends_half_the_bytes_and_averages(world):
    psi = count_parameters(TinyGPT(CFG)) - CFG.seq_len * CFG.d_model  # pos_emb frozen
    dtypes = (torch.bfloat16, torch.float32)
    out = spawn(_reduce, world, dtypes, timeout=TIMEOUT, echo=False)
    runs = {dt: [rank_out[dt] for rank_out in out] for dt in dtypes}
    for dt, size in ((torch.bfloat16, 2), (torch.float32, 4)):
        for events, _, _ in runs[dt]:
            assert events == [("all_reduce", size * psi, str(dt).removeprefix("torch."))]
    assert runs[torch.bfloat16][0][0][0][1] * 2 == runs[torch.float32][0][0][0][1]
    # The value: the mean of the ranks' local gradients, written back into bf16 .grad. Reduced
    # in fp32 it is rounded once, by at most bf16's unit roundoff 2^-8 of the mean; in bf16
    # every addition on the ring rounds a partial sum, so the bound grows with the ranks and
    # with the partial sums' size: world · 2^-8 · Σ|g_r| / world.
    for dt in (torch.float32, torch.bfloat16):
        local = [r[1] for r in runs[dt]]
        for i in range(len(local[0])):
            mean = sum(g[i] for g in local) / world
            size = sum(g[i].abs() for g in local) / world
            bound = (2 ** -8 * mean.abs() + 2 ** -20 * size if dt == torch.float32
                     else world * 2 ** -8 * size)
            for _, _, reduced in runs[dt]:
                assert ((reduced[i] - mean).abs() <= bound + 1e-30).all(), (dt, i)
        assert all(torch.equal(a, b) for r in runs[dt] for a, b in zip(r[2], runs[dt][0][2]))


def _train(rank, world, dtype, reduce):
    xs, ys = _slice(rank, world)
    model = TinyGPT(CFG, device=device()).to(dtype)
    opt = MasterWeightOptimizer(model.parameters(), SGD[0], **SGD[1])
    losses = [data_parallel_step(model, opt, lambda m: m(xs, ys)[1], reduce_dtype=reduce).loss
              for _ in range(STEPS)]
    return losses, [opt.master(p).detach().clone() for p in model.parameters()]


def _float64_reference():
    x, y = make_token_data(BATCH, CFG.seq_len, CFG.vocab_size)
    model = TinyGPT(CFG).double()
    opt = SGD[0](model.parameters(), **SGD[1])
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = model(x, y)[1]
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach() for p in model.parameters()]


# One world size per case (2 and 4 both appear): each launch is seconds of the suite's budget.
@pytest.mark.parametrize("world,dtype,reduce,loss_rtol,param_atol", [
    (4, torch.bfloat16, torch.bfloat16, 1e-2, 2e-2),
    (2, torch.bfloat16, torch.float32, 1e-2, 2e-2),
    (2, torch.float32, torch.float32, 1e-6, 1e-5),
])
def test_data_parallel_step_follows_float64(world, dtype, reduce, loss_rtol, param_atol):
    want_losses, want_params = _float64_reference()
    out = spawn(_train, world, dtype, reduce, timeout=TIMEOUT, echo=False)
    for step, want in enumerate(want_losses):  # equal slices: the mean of the ranks' losses
        got = sum(losses[step] for losses, _ in out) / world
        assert abs(got - want) <= loss_rtol * want, (step, got, want)
    for got, want in zip(out[0][1], want_params):
        torch.testing.assert_close(got.double(), want, rtol=0, atol=param_atol)
    for _, masters in out[1:]:  # replicas stay bit-identical
        assert all(torch.equal(a, b) for a, b in zip(masters, out[0][1]))


def _overflow(rank, world, bad_rank, bad_step, steps=8):
    xs, ys = _slice(rank, world)
    model = TinyGPT(CFG, device=device()).to(torch.float16)
    opt = MasterWeightOptimizer(model.parameters(), torch.optim.Adam, lr=1e-2)
    scaler = DynamicLossScaler(2.0 ** 10, growth_interval=3)
    scales, before, after = [], None, None
    for step in range(steps):
        def loss_fn(m, step=step):
            loss = m(xs, ys)[1]
            # An overflow in this rank's backward only: its gradients become inf/NaN.
            return loss * float("inf") if (rank, step) == (bad_rank, bad_step) else loss
        if step == bad_step:
            before = [p.detach().clone() for p in model.parameters()]
        result = data_parallel_step(model, opt, loss_fn, scaler=scaler,
                                    reduce_dtype=torch.float16)
        scales.append(result.scale)
        if step == bad_step:
            after = [p.detach().clone() for p in model.parameters()]
            stepped = result.stepped
    unchanged = all(torch.equal(a, b) for a, b in zip(before, after))
    return scaler.skipped, scales, stepped, unchanged, [opt.master(p).clone()
                                                         for p in model.parameters()]


@pytest.mark.parametrize("world,bad_rank", [(2, 1), (4, 2)])
def test_overflow_on_one_rank_skips_the_same_step_everywhere(world, bad_rank):
    out = spawn(_overflow, world, bad_rank, 4, timeout=TIMEOUT, echo=False)
    for skipped, scales, stepped, unchanged, masters in out:
        assert skipped == [4] and not stepped and unchanged
        assert scales == out[0][1]
        assert scales[5] == scales[4] / 2  # backed off once
        assert all(torch.equal(a, b) for a, b in zip(masters, out[0][4]))
    assert out[0][1][3] == 2.0 ** 11  # grown after 3 good steps before the overflow


def _local_flags(rank, world, bad_rank, bad_step, steps=5):
    """Each rank steps its own parameters with its own gradients (what a ZeRO or FSDP rank
    sees: only its shard), so only the bad rank can see the overflow."""
    gen = torch.Generator().manual_seed(rank)
    w = torch.nn.Parameter(torch.randn(6, generator=gen).to(device(), torch.float16))
    opt = MasterWeightOptimizer([w], torch.optim.SGD, lr=0.1)
    scaler = DynamicLossScaler(2.0 ** 4)
    local, stepped = [], []
    for step in range(steps):
        w.grad = torch.full_like(w, scaler.scale_value)
        if (rank, step) == (bad_rank, bad_step):
            w.grad[3] = float("inf")
        local.append(bool((~torch.isfinite(w.grad)).any()))
        stepped.append(scaler.step(opt))
        scaler.update()
    return local, stepped, scaler.skipped, scaler.scale_value


def test_the_inf_check_spans_all_ranks():
    out = spawn(_local_flags, 4, 3, 2, timeout=TIMEOUT, echo=False)
    assert [r[0][2] for r in out] == [False, False, False, True]  # only rank 3 saw it
    for _, stepped, skipped, scale in out:
        assert stepped == [True, True, False, True, True] and skipped == [2]
        assert scale == 2.0 ** 3


def _resume(rank, world, stop, steps=6):
    xs, ys = _slice(rank, world)

    def build():
        model = TinyGPT(CFG, device=device()).to(torch.float16)
        return (model, MasterWeightOptimizer(model.parameters(), torch.optim.Adam, lr=1e-2),
                DynamicLossScaler(2.0 ** 12, growth_interval=2))

    def run(parts, n):
        model, opt, scaler = parts
        for _ in range(n):
            data_parallel_step(model, opt, lambda m: m(xs, ys)[1], scaler=scaler,
                               reduce_dtype=torch.float16)

    whole = build()
    run(whole, steps)
    first = build()
    run(first, stop)
    saved = {"model": first[0].state_dict(), "opt": first[1].state_dict(),
             "scaler": first[2].state_dict()}
    again = build()
    again[0].load_state_dict(saved["model"])
    again[1].load_state_dict(saved["opt"])
    again[2].load_state_dict(saved["scaler"])
    run(again, steps - stop)
    return (all(torch.equal(a, b) for a, b in zip(whole[0].parameters(), again[0].parameters()))
            and whole[2].state_dict() == again[2].state_dict())


def test_resume_from_state_dicts_is_bit_for_bit():
    assert spawn(_resume, 2, 3, timeout=TIMEOUT, echo=False) == [True, True]


def _zero_mixed(rank, world, stage):
    xs, ys = _slice(rank, world)
    model = TinyGPT(CFG, device=device()).to(torch.bfloat16)
    opt = ShardedOptimizer(model.parameters(), master_weights(SGD[0]), stage=stage, **SGD[1])
    for _ in range(3):
        opt.zero_grad()
        model(xs, ys)[1].backward()
        opt.step()
    return [p.detach().float() for p in model.parameters()], M.held_model_states(model, opt), [
        f.numel for f in opt.flats]


@pytest.mark.parametrize("world,stage", [(2, 1), (4, 2)])
def test_zero_with_fp32_masters(world, stage):
    x, y = make_token_data(BATCH, CFG.seq_len, CFG.vocab_size)
    ref = TinyGPT(CFG).to(torch.bfloat16)
    ref_opt = MasterWeightOptimizer(ref.parameters(), SGD[0], **SGD[1])
    for _ in range(3):
        ref_opt.zero_grad()
        ref(x, y)[1].backward()
        ref_opt.step()
    for params, held, groups in spawn(_zero_mixed, world, stage, timeout=TIMEOUT, echo=False):
        for got, want in zip(params, ref.parameters()):  # bf16 sums in another order: close
            torch.testing.assert_close(got, want.float(), rtol=0, atol=2e-2)
        want = M.model_state_bytes(groups[0], world, stage, M.MIXED_ADAM, padded=True)
        # SGD with momentum keeps master (4) + momentum (4): K = 8, not Adam's 12.
        want_opt = 8 * M.shard_numel(groups[0], world)
        assert (held.params, held.grads, held.optimizer) == (want.params, want.grads, want_opt)


def _fsdp_reduce(rank, world, reduce, shard):
    xs, ys = _slice(rank, world)
    model = FSDP(TinyGPT(CFG, device=device()), compute_dtype=torch.bfloat16, reduce_dtype=reduce,
                 shard_dtype=shard)
    opt = (MasterWeightOptimizer if shard != torch.float32 else torch.optim.Adam)(
        model.parameters(), lr=1e-3)
    with comm.recording() as trace:
        model(xs, ys)[1].backward()
    grads = [p.grad.float().clone() for p in model.parameters()]
    opt.step()
    scattered = {(e.dtype, e.nbytes) for e in trace.events if e.op == "reduce_scatter_tensor"}
    gathered = {e.dtype for e in trace.events if e.op == "all_gather_into_tensor"}
    return grads, scattered, gathered, M.held_model_states(model, opt), [
        g.numel for g in model._all_groups()]


def test_fsdp_reduce_in_fp32_or_bf16_and_bf16_shards():
    world = 4
    runs = {(r, s): spawn(_fsdp_reduce, world, r, s, timeout=TIMEOUT, echo=False)
            for r, s in ((torch.float32, torch.float32), (torch.bfloat16, torch.float32),
                         (torch.float32, torch.bfloat16))}
    fp32, bf16 = runs[(torch.float32, torch.float32)], runs[(torch.bfloat16, torch.float32)]
    for rank in range(world):
        assert {d for d, _ in fp32[rank][1]} == {"float32"}
        assert {d for d, _ in bf16[rank][1]} == {"bfloat16"}
        assert sorted(n for _, n in bf16[rank][1]) == sorted(n // 2 for _, n in fp32[rank][1])
        assert fp32[rank][2] == bf16[rank][2] == {"bfloat16"}  # computed in bf16 either way
        for a, b in zip(fp32[rank][0], bf16[rank][0]):
            torch.testing.assert_close(b, a, rtol=2e-2, atol=1e-4)
    for _, _, _, held, groups in runs[(torch.float32, torch.bfloat16)]:
        want = [M.model_state_bytes(g, world, 3, M.MIXED_ADAM, padded=True) for g in groups]
        assert (held.params, held.grads, held.optimizer) == tuple(
            sum(getattr(w, k) for w in want) for k in ("params", "grads", "optimizer"))
    for _, _, _, held, groups in fp32:  # fp32 shards: 4 + 4 + 8
        want = [M.model_state_bytes(g, world, 3, M.FP32_ADAM, padded=True) for g in groups]
        assert held.total == sum(w.total for w in want)


# Every mixed method once, split over two launches (lesson 05 runs all six on 4 ranks).
@pytest.mark.parametrize("world,methods", [(2, ("ddp", "zero1", "zero2")),
                                           (4, ("fsdp", "fsdp_fp32_shards", "torch_fsdp2"))])
def test_mixed_precision_bytes_per_rank_equal_the_prediction(world, methods):
    from toolkit.experiments.memory import MIXED_METHODS, predicted_rows, run_methods

    assert set(methods) <= set(MIXED_METHODS)
    rows = predicted_rows(run_methods(world, methods, precision="mixed", steps=1))
    assert len(rows) == world * len(methods)
    for part in ("params", "grads", "optimizer"):
        assert (rows[part] == rows[f"padded_{part}"]).all(), part
    psi = int(rows.psi.iloc[0])
    if "ddp" in methods:
        ddp = rows[rows.method == "ddp"]
        assert (ddp.params == 2 * psi).all() and (ddp.grads == 2 * psi).all()
        assert (ddp.optimizer == 12 * psi).all()  # master + exp_avg + exp_avg_sq, fp32
    if "fsdp" in methods:
        stage3 = rows[rows.method.isin(["fsdp", "fsdp_fp32_shards"])]
        assert (stage3.groupby("rank").method.nunique() == 2).all()
        assert stage3.groupby("rank").measured_total.nunique().eq(1).all()  # 2+2+12 = 4+4+8
    ours = rows[rows.method != "torch_fsdp2"]  # FSDP2 pads every parameter, not each group
    groups = ours.groups.map(len).clip(lower=1)
    assert ((ours.measured_total - ours.pred_total).abs() < 16 * world * groups).all()


def test_errors():
    with pytest.raises(RuntimeError, match="not initialised"):
        all_reduce_gradients([torch.nn.Parameter(torch.ones(2))])
    assert not dist.is_initialized()
