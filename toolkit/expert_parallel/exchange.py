"""The all-to-all that moves tokens between the ranks of an expert-parallel group, two ways.

Rank r holds `send` (N_r, ...) cut along dim 0 into pieces of `in_splits[j]` rows for group rank
j, and receives `out_splits[j]` rows from each rank j, in rank order (the piece it keeps for
itself included). Both split lists may be uneven and may hold zeros: routed tokens never split
evenly.

* ``"all_to_all_single"``: one `dist.all_to_all_single` with uneven split sizes. gloo on CPU
  supports it (zero-sized pieces too; checked in tests/test_expert_parallel.py). The list form
  `dist.all_to_all` does not: gloo refuses pieces of different sizes ("ProcessGroupGloo::alltoall:
  invalid tensor size at index 1", torch 2.13), so it is not offered here
  (`toolkit.experiments.expert_parallel.all_to_all_support` shows it).
* ``"p2p"``: the same exchange from `dist.isend` / `dist.irecv`, one message per non-empty piece
  for another rank (the rank's own piece is a local copy), every receive posted before waiting.
  The recorder then sees each message with its peer and exact size: what leaves the rank.

The recorder counts a collective's input (what the rank passes in, its own piece included) and a
send's payload: `toolkit.cost.experts.step_bytes` gives both.

`AllToAll` is the differentiable version: its backward is the same exchange with the splits
swapped (the all-to-all is its own adjoint, as Ulysses' two all-to-alls are each other's).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["AllToAll", "METHODS", "all_to_all", "group_info"]

METHODS = ("all_to_all_single", "p2p")
"""The ways to run the exchange (module docstring)."""


def group_info(group: Any) -> tuple[int, int]:
    """(this rank's index in `group`, the group's size); (0, 1) when `group` is None (one
    process: nothing to exchange)."""
    if group is None:
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def _check(send: Tensor, in_splits: list[int], out_splits: list[int], p: int) -> None:
    if len(in_splits) != p or len(out_splits) != p:
        raise ValueError(f"all_to_all: in_splits and out_splits need one entry per rank of the "
                         f"group ({p}), got {len(in_splits)} and {len(out_splits)}")
    if any(n < 0 for n in (*in_splits, *out_splits)) or sum(in_splits) != send.shape[0]:
        raise ValueError(f"all_to_all: in_splits must be counts >= 0 adding up to the "
                         f"{send.shape[0]} rows of send, got {in_splits}")


def all_to_all(send: Tensor, in_splits: list[int], out_splits: list[int], *, group: Any = None,
               method: str = "all_to_all_single") -> Tensor:
    """Piece j of `send` (in_splits[j] rows) to group rank j; returns the pieces received,
    out_splits[j] rows from rank j, concatenated in rank order. `group` None: one process, the
    piece is returned as it is."""
    if method not in METHODS:
        raise ValueError(f"all_to_all: method must be one of {METHODS}, got {method!r}")
    me, p = group_info(group)
    _check(send, in_splits, out_splits, p)
    send = send.contiguous()
    recv = send.new_empty((sum(out_splits), *send.shape[1:]))
    if p == 1:
        recv.copy_(send)
        return recv
    if method == "all_to_all_single":
        dist.all_to_all_single(recv, send, out_splits, in_splits, group=group)
        return recv
    sends, recvs = send.split(in_splits), recv.split(out_splits)
    peers = [dist.get_global_rank(group, j) for j in range(p)]  # isend/irecv take global ranks
    works = []
    for j in range(p):  # receives first: every message finds its buffer waiting
        if j != me and out_splits[j]:
            works.append(dist.irecv(recvs[j], src=peers[j], group=group))
    for j in range(p):
        if j != me and in_splits[j]:
            works.append(dist.isend(sends[j], dst=peers[j], group=group))
    recvs[me].copy_(sends[me])
    for work in works:
        work.wait()
    return recv


class AllToAll(torch.autograd.Function):
    """`all_to_all` forward; backward: the gradient goes back with the splits swapped."""

    @staticmethod
    def forward(ctx: Any, send: Tensor, in_splits: list[int], out_splits: list[int], group: Any,
                method: str) -> Tensor:
        ctx.args = (in_splits, out_splits, group, method)
        return all_to_all(send, in_splits, out_splits, group=group, method=method)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple:
        in_splits, out_splits, group, method = ctx.args
        return (all_to_all(grad, out_splits, in_splits, group=group, method=method),
                None, None, None, None)
