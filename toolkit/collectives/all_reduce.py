"""All-reduce without a ring: parameter server, sharded parameter server, tree.

The three designs a reader meets before the ring, each in its α-β cost (p ranks, n bytes):

* parameter server: every rank sends its tensor to one root, which adds them and sends the sum
  back. The root's link carries (p−1)·n bytes each way: ≈ 2(p−1)(α + nβ), growing with p.
* sharded parameter server: each rank is the server for 1/p of the elements. Every rank sends
  each other rank that rank's slice, and sends its reduced slice back to all: 2(p−1)/p · n bytes
  per rank in 2(p−1) messages, like the ring, but each message goes straight to its owner.
  Each phase runs in p−1 steps (step j: send to rank r+j, receive from r−j), one message each
  way per step, so the α-β model's 2(p−1) rounds are what the code does. (Posting all p−1 at
  once would let their latencies overlap where a rank has many ports, as loopback does, and
  is not what the one-port α-β model counts: Thakur, Rabenseifner & Gropp 2005, §2.)
* tree: binomial-tree reduce to the root then binomial-tree broadcast: 2⌈log₂p⌉(α + nβ), few
  rounds but the whole tensor on every hop.

`toolkit.collectives.ring` holds the ring all-reduce; `all_reduce(algorithm=...)` picks any.
"""

from __future__ import annotations

import torch

from ._common import (
    ReduceOpLike, agree, check_tensor, chunk_sizes, combine, exchange, finish_avg, flat_view,
    recv, reduce_op, send, view,
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

    Push, p−1 steps: at step j rank r sends chunk r+j to its server r+j and receives a copy of
    chunk r from rank r−j. Reduce chunk r. Pull, p−1 steps: send chunk r to rank r+j, receive
    chunk r−j from its server. One message each way per step: 2(p−1) rounds.
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
    for step in range(1, g.size):  # push: one message each way per step
        dst, src = (g.rank + step) % g.size, (g.rank - step) % g.size
        exchange(g, send=chunks[dst], dst=dst, recv=inbox[src], src=src)
    add = combine(op)
    for j in others:  # in rank order, so every rank's float sum is reproducible
        add(mine, inbox[j])
    finish_avg(op, mine, g.size)
    for step in range(1, g.size):  # pull: the reduced chunk to everyone, theirs from each
        dst, src = (g.rank + step) % g.size, (g.rank - step) % g.size
        exchange(g, send=mine, dst=dst, recv=chunks[src], src=src)
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
