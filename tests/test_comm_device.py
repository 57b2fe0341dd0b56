"""The recorder on any device: a call is recorded from the tensor's metadata (bytes, dtype,
shape, storage offset), its data is read only when a recording asks for values, and then as
host numbers, so events are plain data that come back to the parent on the CPU whatever the
ranks computed on (NCCL: CUDA tensors; tests/test_gpu.py runs that part)."""

from __future__ import annotations

import pickle

import pytest
import torch
import torch.distributed as dist

from toolkit import comm
from toolkit.comm import patch
from toolkit.launch import device, spawn

PLAIN = (int, float, str, bool, type(None))


def _plain(value) -> bool:
    if isinstance(value, (tuple, list)):
        return all(_plain(v) for v in value)
    return isinstance(value, PLAIN)


def test_a_meta_payload_is_recorded_from_metadata_alone():
    # meta tensors have shapes and dtypes but no data: recording one (values asked for, too)
    # proves the recorder never reads a tensor it was not asked to copy.
    calls = []

    def fake_send(tensor, dst=None, group=None, tag=0, group_dst=None):
        calls.append((tuple(tensor.shape), dst))

    wrapped = patch._make_wrapper("send", fake_send, patch.SPECS["send"])
    t = torch.empty(6, 5, dtype=torch.bfloat16, device="meta")[2:]
    patch.attach(0, None)
    try:
        with comm.recording(values=64) as trace:
            wrapped(t, 3)
    finally:
        patch.detach()
    [e] = trace.events
    assert calls == [((4, 5), 3)]
    assert (e.op, e.peer, e.nbytes, e.dtype, e.shape, e.offset) == \
        ("send", 3, 40, "bfloat16", (4, 5), 10)
    assert e.values is None


def _sends(rank, world_size):
    dev = device()
    if rank == 0:
        dist.send(torch.tensor([1.5, -2.0, 0.25, 3.0, 8.0], dtype=torch.bfloat16, device=dev), 1)
        dist.isend(torch.arange(6, dtype=torch.int64, device=dev)[3:], 1).wait()
    else:
        inbox = torch.empty(5, dtype=torch.bfloat16, device=dev)
        dist.recv(inbox, 0)
        dist.irecv(torch.empty(3, dtype=torch.int64, device=dev), 0).wait()
    t = torch.full((4,), float(rank), device=dev)
    dist.all_reduce(t)
    return t


@pytest.mark.multirank
def test_events_are_plain_host_data_with_values_as_numbers():
    with comm.recording(values=8) as trace:
        out = spawn(_sends, 2, timeout=60, echo=False)
    assert [o.tolist() for o in out] == [[1.0] * 4] * 2
    for e in trace:
        assert all(_plain(v) for v in e.as_tuple()), e
    pickle.loads(pickle.dumps([e.as_tuple() for e in trace]))  # no tensor inside
    [send] = trace.where(op="send")
    [isend] = trace.where(op="isend")
    assert (send.nbytes, send.dtype, send.values) == (10, "bfloat16", (1.5, -2.0, 0.25, 3.0, 8.0))
    assert (isend.nbytes, isend.dtype, isend.offset, isend.values) == (24, "int64", 3, (3, 4, 5))
    assert all(isinstance(v, int) for v in isend.values)
    assert [e.values for e in trace.where(op=("recv", "irecv", "all_reduce"))] == [None] * 4
    assert {e.nbytes for e in trace.where(op="all_reduce")} == {16}
