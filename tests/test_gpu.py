"""The NCCL path: same worker code, one GPU per rank. Skipped without GPUs (CI has none);
run `make test` on a GPU node to exercise it."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from toolkit import comm
from toolkit.launch import context, device, gpu_count, spawn

pytestmark = [pytest.mark.gpu, pytest.mark.multirank,
              pytest.mark.skipif(gpu_count() < 1, reason="needs at least one CUDA GPU")]


def on_gpu(rank, world_size):
    t = torch.full((1000,), float(rank), device=device())
    with comm.recording() as trace:
        dist.all_reduce(t)
    return context().backend, str(t.device), t[:2], trace.totals()[rank].collective_bytes


def test_auto_picks_nccl_and_one_gpu_per_rank():
    world = min(2, gpu_count())
    out = spawn(on_gpu, world, timeout=180)
    expected = float(sum(range(world)))
    for rank, (backend, dev, head, nbytes) in enumerate(out):
        assert backend == "nccl" and dev == f"cuda:{rank}"
        assert head.device.type == "cpu"  # CUDA tensors come back on the CPU
        assert head.tolist() == [expected, expected] and nbytes == 4000
    assert not torch.cuda.is_initialized()  # the caller never touched CUDA: forking stays safe
