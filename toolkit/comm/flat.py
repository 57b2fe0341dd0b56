"""The flat (single-tensor) all-gather and reduce-scatter, under one name on every torch the
course accepts.

torch 2.13 renamed them: ``all_gather_into_tensor`` and ``reduce_scatter_tensor`` now warn
(FutureWarning) and call ``all_gather_single`` / ``reduce_scatter_single``, which older torch
(2.4-2.12, inside pyproject.toml's range) does not have. The toolkit's algorithms (ZeRO, FSDP,
compression, the experiments) call the old names through these two functions, with torch's
rename warning silenced here only: a recording shows ``all_gather_into_tensor`` and
``reduce_scatter_tensor`` whatever the version (the recorder does not record the nested call),
and a rank's output carries no warning the course's own code caused. When the course's range
starts at a torch that has the new names, switch these two bodies to them; nothing else changes.
Importing this module changes nothing.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch.distributed as dist
from torch import Tensor

_RENAMED = r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated"


def gather_into(out: Tensor, inp: Tensor, group: Any = None, async_op: bool = False) -> Any:
    """``dist.all_gather_into_tensor(out, inp)``: every rank's `inp` in rank order into `out`
    (p·numel); a work handle with `async_op`."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_RENAMED, category=FutureWarning)
        return dist.all_gather_into_tensor(out, inp, group=group, async_op=async_op)


def reduce_scatter_into(out: Tensor, inp: Tensor, op: Any = dist.ReduceOp.SUM, group: Any = None,
                        async_op: bool = False) -> Any:
    """``dist.reduce_scatter_tensor(out, inp)``: the `op` of every rank's `inp`, rank r keeping
    its r-th slice of numel/p in `out`; a work handle with `async_op`."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_RENAMED, category=FutureWarning)
        return dist.reduce_scatter_tensor(out, inp, op=op, group=group, async_op=async_op)
