"""toolkit.comm.kernel_io: the bytes a rank hands the kernel while gloo sends a tensor are the
tensor's bytes, plus gloo's small headers: what lesson 16 sets beside the recorder's count."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from toolkit.comm.kernel_io import written_bytes
from toolkit.launch import spawn

pytestmark = pytest.mark.multirank
NBYTES = 4 << 20      # 4 MiB: headers are noise beside it


def _send(rank, world_size):
    payload = torch.ones(NBYTES // 4)
    dist.barrier()
    before = written_bytes()
    if rank == 0:
        dist.send(payload, dst=1)
    else:
        dist.recv(payload, src=0)
    after = written_bytes()
    dist.barrier()
    return None if before is None else after - before


def test_written_bytes_match_a_send():
    sent, received = spawn(_send, 2, timeout=60)
    if sent is None:
        pytest.skip("no /proc/self/io here")
    assert NBYTES <= sent <= NBYTES * 1.001 + 4096     # the payload, and headers of a few KB
    assert received < 4096                             # the receiver wrote (almost) nothing
