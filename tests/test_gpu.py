"""The GPU placements: the same worker code with a GPU per rank (NCCL) or ranks sharing the
GPUs there are (gloo on CUDA tensors, point-to-point staged through host memory). Everything
here runs on one GPU: ``device="cuda"`` gives NCCL when there is a GPU per rank and shares the
GPUs otherwise, so each test asks for what it needs and no more. Skipped without a GPU (CI has
none); on a GPU machine `make gpu-check` runs these (docs/cluster.md). What can be checked
without a GPU is in tests/test_fork_safety.py and tests/test_comm_staging.py."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from test_comm_staging import exchange

from toolkit import collectives as C
from toolkit import comm
from toolkit.data_parallel.fsdp import FullyShardedDataParallel
from toolkit.data_parallel.zero import ShardedOptimizer
from toolkit.launch import context, device, driver_live, gpu_count, spawn
from toolkit.models import TinyMLP, make_regression_data

pytestmark = [pytest.mark.gpu, pytest.mark.multirank,
              pytest.mark.skipif(gpu_count() < 1, reason="needs a CUDA GPU")]
TIMEOUT = 180  # ranks that each start CUDA (and NCCL)


def on_gpu(rank, world_size):
    t = torch.full((1000,), float(rank), device=device())
    with comm.recording() as trace:
        dist.all_reduce(t)
    return context().backend, str(t.device), t[:2], trace.totals()[rank].collective_bytes


def test_auto_picks_nccl_with_a_gpu_per_rank():
    world = min(2, gpu_count())  # world size 1 on one GPU: NCCL still runs
    out = spawn(on_gpu, world, timeout=TIMEOUT)
    expected = float(sum(range(world)))
    for rank, (backend, dev, head, nbytes) in enumerate(out):
        assert backend == "nccl" and dev == f"cuda:{rank}"
        assert head.device.type == "cpu"  # CUDA tensors come back on the CPU
        assert head.tolist() == [expected, expected] and nbytes == 4000
    assert not driver_live()  # the caller never started the CUDA driver: forking stays safe


def where(rank, world_size):
    ctx = context()
    return ctx.backend, ctx.placement, str(ctx.device), torch.cuda.current_device()


def test_shared_placement_puts_rank_r_on_gpu_r_mod_g():
    g = min(gpu_count(), 3)
    out = spawn(where, 3, backend="gloo", device="cuda", timeout=TIMEOUT)
    assert [o[:2] for o in out] == [("gloo", "shared")] * 3
    assert [o[2] for o in out] == [f"cuda:{r % g}" for r in range(3)]
    assert [o[3] for o in out] == [r % g for r in range(3)]


def staged_exchange(rank, world_size):
    with comm.recording(values=4) as trace:
        got = exchange(rank, world_size, str(device()))
    fields = sorted(((e.op, e.peer, e.nbytes, e.dtype, e.offset, e.values) for e in trace),
                    key=repr)
    return got, fields, comm.staging.staged_messages()


def cpu_exchange(rank, world_size):
    with comm.recording(values=4) as trace:
        got = exchange(rank, world_size, "cpu")
    return got, sorted(((e.op, e.peer, e.nbytes, e.dtype, e.offset, e.values) for e in trace),
                       key=repr)


@pytest.mark.parametrize("world_size", [2, 3])
def test_staged_point_to_point_on_shared_gpus_equals_the_cpu(world_size):
    gpu = spawn(staged_exchange, world_size, backend="gloo", device="cuda", timeout=TIMEOUT)
    cpu = spawn(cpu_exchange, world_size, device="cpu", timeout=TIMEOUT)
    for (got, events, staged), (want, cpu_events) in zip(gpu, cpu):
        assert got == want and events == cpu_events  # same values, same recorded bytes
        assert staged >= sum(1 for e in events if e[0] in comm.staging.STAGED_OPS) > 0


def recorded_sends(rank, world_size):
    t = torch.tensor([1.5, -2.0, 0.25], dtype=torch.bfloat16, device=device())
    if rank == 0:
        dist.isend(t, 1).wait()
    else:
        dist.irecv(t, 0).wait()
    return t.device.type, t.tolist()


def test_recorder_keeps_bytes_dtype_and_host_values_of_cuda_sends():
    with comm.recording(values=4) as trace:
        out = spawn(recorded_sends, 2, device="cuda", timeout=TIMEOUT)
    assert out == [("cuda", [1.5, -2.0, 0.25])] * 2
    [send] = trace.where(op="isend")
    assert (send.nbytes, send.dtype, send.values) == (6, "bfloat16", (1.5, -2.0, 0.25))
    assert trace.where(op="irecv")[0].values is None


GLOO_CUDA = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
             "reduce_scatter_tensor", "all_to_all_single", "barrier", "gather", "scatter",
             "all_to_all", "reduce_scatter")
"""torch's collectives on CUDA tensors over gloo: the first eight measured to work on one H200
(2 processes on cuda:0); the last four not yet measured (each reports on its own)."""


def torch_collectives(rank, world_size):
    dev, p, out = device(), world_size, {}
    x = torch.arange(4, dtype=torch.float32, device=dev) + 10 * rank
    total = sum(torch.arange(4, dtype=torch.float32) + 10 * r for r in range(p))

    def run(name, fn):
        try:
            out[name] = bool(fn())
        except Exception as exc:  # noqa: BLE001 - reported per collective
            out[name] = f"{type(exc).__name__}: {str(exc)[:200]}"

    def all_reduce():
        t = x.clone()
        dist.all_reduce(t)
        return torch.equal(t.cpu(), total)

    def broadcast():
        t = x.clone()
        dist.broadcast(t, 1)
        return torch.equal(t.cpu(), torch.arange(4.0) + 10)

    def reduce():
        t = x.clone()
        dist.reduce(t, 0)
        return rank != 0 or torch.equal(t.cpu(), total)

    def all_gather():
        parts = [torch.empty_like(x) for _ in range(p)]
        dist.all_gather(parts, x)
        return all(torch.equal(t.cpu(), torch.arange(4.0) + 10 * r) for r, t in enumerate(parts))

    def all_gather_into_tensor():
        flat = x.new_empty(4 * p)
        dist.all_gather_into_tensor(flat, x)
        return torch.equal(flat.cpu(), torch.cat([torch.arange(4.0) + 10 * r for r in range(p)]))

    def reduce_scatter_tensor():
        mine = x.new_empty(1)
        dist.reduce_scatter_tensor(mine, x.repeat(p)[:p].contiguous())
        return torch.equal(mine.cpu(), total[rank:rank + 1])

    def all_to_all_single():
        got = x.new_empty(p)
        dist.all_to_all_single(got, x[:p].contiguous())
        return torch.equal(got.cpu(), torch.tensor([rank + 10.0 * r for r in range(p)]))

    def gather():
        parts = [torch.empty_like(x) for _ in range(p)] if rank == 0 else None
        dist.gather(x, parts, 0)
        return rank != 0 or all(torch.equal(t.cpu(), torch.arange(4.0) + 10 * r)
                                for r, t in enumerate(parts))

    def scatter():
        mine = torch.empty_like(x)
        dist.scatter(mine, [x + r for r in range(p)] if rank == 0 else None, 0)
        return torch.equal(mine.cpu(), torch.arange(4.0) + rank)

    def all_to_all():
        got = [x.new_empty(1) for _ in range(p)]
        dist.all_to_all(got, [x[r:r + 1].clone() for r in range(p)])
        return [t.item() for t in got] == [rank + 10.0 * r for r in range(p)]

    def reduce_scatter():
        mine = x.new_empty(1)
        dist.reduce_scatter(mine, [x[r:r + 1].clone() for r in range(p)])
        return torch.equal(mine.cpu(), total[rank:rank + 1])

    def barrier():
        dist.barrier()
        return True

    fns = {f.__name__: f for f in (all_reduce, broadcast, reduce, all_gather,
                                   all_gather_into_tensor, reduce_scatter_tensor,
                                   all_to_all_single, barrier, gather, scatter, all_to_all,
                                   reduce_scatter)}
    for name in GLOO_CUDA:
        run(name, fns[name])
        dist.barrier()  # a collective that failed on one rank must not run into the next
    return out


@pytest.fixture(scope="module")
def gloo_on_cuda():
    return spawn(torch_collectives, 2, backend="gloo", device="cuda", timeout=TIMEOUT)


@pytest.mark.parametrize("name", GLOO_CUDA)
def test_torch_collectives_on_cuda_tensors_over_gloo(gloo_on_cuda, name):
    assert [r[name] for r in gloo_on_cuda] == [True, True]


def toolkit_collectives(rank, world_size):
    dev, out = device(), {}
    base = torch.arange(10, dtype=torch.float32, device=dev) + 100 * rank  # 10: not p | n
    for name in ("ring", "sliced_ring", "tree", "ps", "sharded_ps"):
        mine, theirs = base.clone(), base.clone()
        C.all_reduce(mine, algorithm=name)  # the agreement header travels too
        dist.all_reduce(theirs)
        out[name] = torch.equal(mine, theirs) and mine.device.type == "cuda"
    b = base.clone()
    C.broadcast(b, src=1)
    out["broadcast"] = torch.equal(b, torch.arange(10, dtype=torch.float32, device=dev) + 100)
    return context().placement, out


def test_toolkit_collectives_equal_the_backend_s_own():
    for placement, result in spawn(toolkit_collectives, 2, device="cuda", timeout=TIMEOUT):
        assert placement == ("gpu" if gpu_count() >= 2 else "shared")
        assert all(result.values()), result


def sharded_training(rank, world_size, method):
    dev = device()
    model = TinyMLP(d_in=7, d_hidden=10, d_out=3, seed=0, device=dev)  # 223: not p | n
    x, y = make_regression_data(8, 7, 3, device=dev)
    x, y = x.tensor_split(world_size)[rank], y.tensor_split(world_size)[rank]
    if method == "fsdp":
        model = FullyShardedDataParallel(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
    else:
        opt = ShardedOptimizer(model.parameters(), torch.optim.SGD, stage=int(method[-1]), lr=0.1)
    places = {p.device.type for p in model.parameters()}
    for _ in range(3):
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    params = model.full_state_dict() if method == "fsdp" else model.state_dict()
    return places | {p.device.type for p in model.parameters()}, params


def one_process(rank, world_size):
    """The single-process reference, in a CPU rank: a backward in the test process itself would
    start the CUDA driver there (autograd asks for the GPU count), and every later launch of the
    session would need fresh interpreters instead of forks."""
    ref = TinyMLP(d_in=7, d_hidden=10, d_out=3, seed=0)
    x, y = make_regression_data(8, 7, 3)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        F.mse_loss(ref(x), y).backward()
        opt.step()
    return ref.state_dict()


@pytest.mark.parametrize("method", ["zero1", "zero2", "fsdp"])
def test_sharded_training_stays_on_the_gpu_and_equals_one_process(method):
    [ref] = spawn(one_process, 1, device="cpu", timeout=TIMEOUT)
    for places, params in spawn(sharded_training, 2, method, device="cuda", timeout=TIMEOUT):
        assert places == {"cuda"}  # flat buffers made on the CPU would have moved them
        for name, value in ref.items():
            assert torch.allclose(params[name], value, atol=1e-5), name
    assert not driver_live()
