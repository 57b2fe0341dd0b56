"""An isend/irecv posted straight on the process group, recorded as the wrapper records it.

torch's ``dist.isend`` checks its arguments in Python on every call (the group, the rank in it,
the tensor) before it calls ``ProcessGroup.send``: 10-19 µs of CPU per message on this 2-core
machine (4-byte messages between 2 ranks, nice 19: 22-29 µs through ``ProcessGroup.send/recv``,
31-47 through ``dist.isend/irecv``), paid again for each of the 2(p−1)·S messages of a sliced
ring. `post_p2p` makes the same ``ProcessGroup.send/recv`` call for a caller that
checked its group once (`toolkit.collectives.GroupView`), and records it through the wrapper's
own `_call_recorded`, so a recording holds the same events either way (tests/test_comm_post.py).
Importing this module changes nothing.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from . import staging
from .patch import SPECS, _call_recorded
from .recorder import RECORDER


def _torchs_own(fn: Any, name: str) -> bool:
    """`fn` is torch's `distributed_c10d.<name>` itself (not a replacement someone installed)."""
    return (getattr(fn, "__module__", None) == c10d.__name__
            and getattr(fn, "__qualname__", None) == name)


def post_p2p(name: str, tensor: torch.Tensor, peer: int, group: Any, group_peer: int) -> Any:
    """``dist.isend`` / ``dist.irecv`` (`name`) of `tensor` to or from global rank `peer`
    (rank `group_peer` of `group`; None: the world), recorded exactly as the wrapper records
    that call, but posted straight on the process group (``ProcessGroup.send/recv``, what
    torch's function calls) without torch's Python checks (module docstring).

    Falls back to the function itself whenever that could differ: a replacement installed
    in place of torch's (the wrapper's or torch's own are the only ones known), a tensor
    subclass (``__torch_function__``), a complex tensor (torch sends it as real pairs), a
    GPU tensor on gloo (staged through host memory, `toolkit.comm.staging`).
    """
    fn = getattr(dist, name)
    wrapped = getattr(fn, "__toolkit_wrapped__", False)
    inner = RECORDER.originals.get(name) if wrapped else fn
    if staging.wanted(tensor, group):  # a GPU tensor on gloo: through host memory
        if wrapped:
            return fn(tensor, peer, group=group)
        return staging.call(name, fn, tensor, (tensor, peer), {"group": group})
    if (not _torchs_own(inner, name) or type(tensor) is not torch.Tensor
            or tensor.is_complex()):
        return fn(tensor, peer, group=group)
    pg = c10d._get_default_group() if group is None else group
    post = pg.send if name == "isend" else pg.recv
    rec = RECORDER
    if not wrapped or rec.tls.depth or (rec.board is None and not rec.sinks):
        return post([tensor], group_peer, 0)
    return _call_recorded(name, SPECS[name], lambda: post([tensor], group_peer, 0), tensor,
                          group, peer, True)


__all__ = ["post_p2p"]
