"""`toolkit.comm.staging`: point-to-point of GPU tensors on gloo goes through host buffers.

No GPU here, so `staging.forced()` stages CPU tensors along the same path (host buffer, copy,
send; receive, copy back on wait) and every test runs the same rank code twice, staged and
direct: values, the recorded events (bytes, dtype, shape, offset, values, peer) and the
toolkit's collectives must not tell the two apart. On a GPU the same tests run with CUDA
tensors in tests/test_gpu.py (the shared placement).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from toolkit import collectives as C
from toolkit import comm
from toolkit.comm import staging
from toolkit.launch import spawn

pytestmark = pytest.mark.multirank
TIMEOUT = 60


def _fields(e) -> tuple:
    """What an event says, except when it happened and its number."""
    return (e.rank, e.op, e.peer, e.nbytes, e.dtype, e.shape, e.group, e.async_op, e.offset,
            e.values, e.end is not None)


def exchange(rank: int, world_size: int, dev: str = "cpu") -> dict:
    """Every point-to-point form once, with tensors on `dev`: blocking, async, batched, from
    any source, a slice of a buffer (offset), bf16; then the toolkit's ring and sliced ring
    (posted straight on the group by `post_p2p`), and a tree broadcast. (tests/test_gpu.py runs
    it with CUDA tensors on ranks sharing a GPU.)"""
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    data = torch.arange(12, dtype=torch.float32, device=dev) + 100 * rank
    out: dict = {}
    into = torch.zeros(3, device=dev)
    works = [dist.irecv(into, left), dist.isend(data[2:5], right)]  # offset 2
    for w in works:
        w.wait()
    out["isend"] = into.tolist()
    half = torch.tensor([1.5, -2.0], dtype=torch.bfloat16, device=dev) * (rank + 1)
    got = torch.zeros(2, dtype=torch.bfloat16, device=dev)
    if rank % 2 == 0:  # even/odd order: blocking send and recv pair up
        dist.send(half, right)
        dist.recv(got, left)
    else:
        dist.recv(got, left)
        dist.send(half, right)
    out["send"] = got.float().tolist()
    into = torch.zeros(3, device=dev)
    ops = [dist.P2POp(dist.isend, data[:3].clone(), right),
           dist.P2POp(dist.irecv, into, left)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    out["batch"] = into.tolist()
    if rank == 0:
        anyone = torch.zeros(1, device=dev)
        out["from"] = sorted(dist.recv(anyone) for _ in range(world_size - 1))
    else:
        dist.send(torch.tensor([float(rank)], device=dev), 0)
    dist.barrier()  # or rank 0's receive from anyone could match a ring's first message
    for algorithm in ("ring", "sliced_ring", "tree"):
        t = torch.arange(7, dtype=torch.float64, device=dev) * (rank + 1)  # 7: not p | n
        C.all_reduce(t, algorithm=algorithm)
        out[algorithm] = t.tolist()
    b = data.clone()
    C.broadcast(b, src=1)
    out["broadcast"] = b.tolist()
    return out


def both_ways(rank: int, world_size: int) -> tuple:
    runs = {}
    for how in ("direct", "staged"):
        before = staging.staged_messages()
        with comm.recording(values=4) as trace:
            if how == "staged":
                with staging.forced():
                    runs[how] = exchange(rank, world_size)
            else:
                runs[how] = exchange(rank, world_size)
        # As a multiset: receives from any source may arrive in either order.
        runs[how + " events"] = sorted((_fields(e) for e in trace), key=repr)
        runs[how + " staged"] = staging.staged_messages() - before
    return runs


@pytest.mark.parametrize("world_size", [2, 3])
def test_staged_messages_equal_direct_ones_in_values_and_in_the_record(world_size):
    for rank, runs in enumerate(spawn(both_ways, world_size, timeout=TIMEOUT)):
        assert runs["staged"] == runs["direct"], rank
        assert runs["staged events"] == runs["direct events"], rank  # same bytes, same events
        assert runs["direct staged"] == 0
        p2p = sum(1 for e in runs["direct events"] if e[1] in staging.STAGED_OPS)
        # Every recorded send and receive went through a host buffer (the ring's 48-byte
        # agreement headers too, unrecorded: hence at least as many as recorded).
        assert p2p > 0 and runs["staged staged"] >= p2p, rank
    left = (0 - 1) % world_size
    direct = spawn(both_ways, world_size, timeout=TIMEOUT)[0]["direct"]
    assert direct["isend"] == [100.0 * left + k for k in (2, 3, 4)]  # the slice that was sent
    assert direct["from"] == list(range(1, world_size))


def test_only_device_tensors_on_gloo_are_staged_unless_forced():
    t = torch.zeros(3)
    assert not staging.wanted(t, None)  # a CPU tensor: never looks at the group
    assert not staging.wanted(torch.zeros(3, device="meta"), None)
    assert not staging.wanted("not a tensor", None)
    with staging.forced():
        assert not staging.wanted(t, None)  # no process group here: torch's own error follows
        assert not staging.wanted(torch.zeros(4, 4).t(), None)  # non-contiguous: not staged


def _forced_checks(rank, world_size):
    with staging.forced():
        return (staging.wanted(torch.zeros(3), None),
                staging.wanted(torch.zeros(4, 4).t(), None))  # torch raises on it, as on CPU


def test_in_a_gloo_rank_forced_staging_takes_contiguous_tensors():
    assert spawn(_forced_checks, 2, timeout=TIMEOUT) == [(True, False), (True, False)]
