"""The NCCL path: same worker code, one GPU per rank. Skipped without GPUs (CI has none);
on a GPU node `make gpu-check` runs these (docs/cluster.md)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from toolkit import collectives as C
from toolkit import comm
from toolkit.data_parallel.fsdp import FullyShardedDataParallel
from toolkit.data_parallel.zero import ShardedOptimizer
from toolkit.launch import context, device, gpu_count, spawn
from toolkit.models import TinyMLP, make_regression_data

pytestmark = [pytest.mark.gpu, pytest.mark.multirank,
              pytest.mark.skipif(gpu_count() < 1, reason="needs at least one CUDA GPU")]
two_gpus = pytest.mark.skipif(gpu_count() < 2, reason="needs 2 CUDA GPUs (one per rank)")
TIMEOUT = 180  # spawned interpreters that each start CUDA and NCCL


def on_gpu(rank, world_size):
    t = torch.full((1000,), float(rank), device=device())
    with comm.recording() as trace:
        dist.all_reduce(t)
    return context().backend, str(t.device), t[:2], trace.totals()[rank].collective_bytes


def test_auto_picks_nccl_and_one_gpu_per_rank():
    world = min(2, gpu_count())
    out = spawn(on_gpu, world, timeout=TIMEOUT)
    expected = float(sum(range(world)))
    for rank, (backend, dev, head, nbytes) in enumerate(out):
        assert backend == "nccl" and dev == f"cuda:{rank}"
        assert head.device.type == "cpu"  # CUDA tensors come back on the CPU
        assert head.tolist() == [expected, expected] and nbytes == 4000
    assert not torch.cuda.is_initialized()  # the caller never touched CUDA: forking stays safe


def recorded_sends(rank, world_size):
    t = torch.tensor([1.5, -2.0, 0.25], dtype=torch.bfloat16, device=device())
    if rank == 0:
        dist.isend(t, 1).wait()
    else:
        dist.irecv(t, 0).wait()
    return t.device.type


@two_gpus
def test_recorder_keeps_bytes_dtype_and_host_values_of_cuda_sends():
    with comm.recording(values=4) as trace:
        assert spawn(recorded_sends, 2, timeout=TIMEOUT) == ["cuda", "cuda"]
    [send] = trace.where(op="isend")
    assert (send.nbytes, send.dtype, send.values) == (6, "bfloat16", (1.5, -2.0, 0.25))
    assert trace.where(op="irecv")[0].values is None


def toolkit_collectives(rank, world_size):
    dev, out = device(), {}
    base = torch.arange(10, dtype=torch.float32, device=dev) + 100 * rank  # 10: not p | n
    for name in ("ring", "tree", "ps", "sharded_ps"):
        mine, theirs = base.clone(), base.clone()
        C.all_reduce(mine, algorithm=name)  # the agreement header travels on the GPU too
        dist.all_reduce(theirs)
        out[name] = torch.equal(mine, theirs) and mine.device.type == "cuda"
    b = base.clone()
    C.broadcast(b, src=1)
    out["broadcast"] = torch.equal(b, torch.arange(10, dtype=torch.float32, device=dev) + 100)
    return out


@two_gpus
def test_toolkit_collectives_equal_nccl_builtins():
    for result in spawn(toolkit_collectives, 2, timeout=TIMEOUT):
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


@two_gpus
@pytest.mark.parametrize("method", ["zero1", "zero2", "fsdp"])
def test_sharded_training_stays_on_the_gpu_and_equals_one_process(method):
    ref = TinyMLP(d_in=7, d_hidden=10, d_out=3, seed=0)
    x, y = make_regression_data(8, 7, 3)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        F.mse_loss(ref(x), y).backward()
        opt.step()
    for places, params in spawn(sharded_training, 2, method, timeout=TIMEOUT):
        assert places == {"cuda"}  # flat buffers made on the CPU would have moved them
        for name, value in ref.state_dict().items():
            assert torch.allclose(params[name], value, atol=1e-5), name
