"""All-reduce without a ring: parameter server, sharded parameter server, tree.

The three designs a reader meets before the ring, each in its α-β cost (p ranks, n bytes):

* parameter server: every rank sends its tensor to one root, which adds them and sends the sum
  back. The root's link carries (p−1)·n bytes each way: ≈ 2(p−1)(α + nβ), growing with p.
* sharded parameter server: each rank is the server for 1/p of the elements. Every rank sends
  each other rank that rank's slice, and sends its reduced slice back to all: 2(p−1)/p · n bytes
  per rank, like the ring, but p−1 messages arrive at each rank at once (fan-in).
* tree: binomial-tree reduce to the root then binomial-tree broadcast: 2⌈log₂p⌉(α + nβ), few
  rounds but the whole tensor on every hop.

`toolkit.collectives.ring` holds the ring all-reduce; `all_reduce(algorithm=...)` picks any.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ._common import (
    ReduceOpLike, agree, check_tensor, chunk_sizes, combine, finish_avg, flat_view, recv,
    reduce_op, send, view,
)
from .rooted import tree_broadcast, tree_reduce


def ps_all_reduce(tensor: torch.Tensor, group=None, *, op: ReduceOpLike = "sum",
                  root: int | None = None, check: bool = True) -> torch.Tensor:
    """All-reduce in place through one parameter server `root` (global rank; default: the
    group's first rank). The root receives from every rank in turn, then sends to each in turn."""
    name = "ps_all_reduce"
    op = reduce_op(op, name)
    check_tensor(tensor, name, "tensor", op)
    g = view(group, name)
    server = 0 if root is None else g.group_rank(root, name=name, arg="root")
    if g.rank < 0 or g.size == 1:
        return tensor
    if check:
        agree(g, name, numel=tensor.numel(), dtype=tensor.dtype, device=tensor.device, op=op,
              root=server)
    flat, copied = flat_view(tensor)
    if g.rank == server:
        add, scratch = combine(op), torch.empty_like(flat)
        workers = [i for i in range(g.size) if i != server]
        for i in workers:
            recv(g, scratch, i)
            add(flat, scratch)
        finish_avg(op, flat, g.size)
        for i in workers:
            send(g, flat, i)
    else:
        send(g, flat, server)
        recv(g, flat, server)
    if copied:
        tensor.copy_(flat.view_as(tensor))
    return tensor


def sharded_ps_all_reduce(tensor: torch.Tensor, group=None, *, op: ReduceOpLike = "sum",
                          check: bool = True) -> torch.Tensor:
    """All-reduce in place with every rank serving one chunk (`chunk_sizes` split).

    Push: rank r sends chunk j to rank j for every j ≠ r and receives p−1 copies of chunk r,
    all posted at once. Reduce chunk r. Pull: send chunk r to everyone, receive every other.
    """
    name = "sharded_ps_all_reduce"
    op = reduce_op(op, name)
    check_tensor(tensor, name, "tensor", op)
    g = view(group, name)
    if g.rank < 0 or g.size == 1:
        return tensor
    if check:
        agree(g, name, numel=tensor.numel(), dtype=tensor.dtype, device=tensor.device, op=op)
    flat, copied = flat_view(tensor)
    chunks = list(flat.split(chunk_sizes(flat.numel(), g.size)))
    mine = chunks[g.rank]
    others = [j for j in range(g.size) if j != g.rank]

    inbox = {j: torch.empty_like(mine) for j in others}
    works = [dist.isend(chunks[j], g.peer(j), group=g.handle) for j in others]
    works += [dist.irecv(inbox[j], g.peer(j), group=g.handle) for j in others]
    for w in works:
        w.wait()
    add = combine(op)
    for j in others:  # in rank order, so every rank's float sum is reproducible
        add(mine, inbox[j])
    finish_avg(op, mine, g.size)

    works = [dist.isend(mine, g.peer(j), group=g.handle) for j in others]
    works += [dist.irecv(chunks[j], g.peer(j), group=g.handle) for j in others]
    for w in works:
        w.wait()
    if copied:
        tensor.copy_(flat.view_as(tensor))
    return tensor


def tree_all_reduce(tensor: torch.Tensor, group=None, *, op: ReduceOpLike = "sum",
                    check: bool = True) -> torch.Tensor:
    """All-reduce in place: `tree_reduce` to the group's first rank, then `tree_broadcast`."""

    name = "tree_all_reduce"
    op = reduce_op(op, name)
    check_tensor(tensor, name, "tensor", op)
    g = view(group, name)
    if g.rank < 0 or g.size == 1:
        return tensor
    if check:
        agree(g, name, numel=tensor.numel(), dtype=tensor.dtype, device=tensor.device, op=op)
    tree_reduce(tensor, g.peer(0), group, op=op, check=False)
    tree_broadcast(tensor, g.peer(0), group, check=False)
    return tensor
