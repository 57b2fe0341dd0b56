"""Collectives with a root: broadcast and reduce (linear and binomial tree), scatter, gather.

Roots (`src`, `dst`) are *global* ranks, as in `torch.distributed`, also for a subgroup.
Cost of each (Thakur, Rabenseifner & Gropp 2005), p ranks, n bytes, α per message, β per byte:

==================  ======================  =======================================
The "linear" algorithms wait for each message before starting the next: one link at the root,
used one message at a time, which is what the model above assumes.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ._common import (
    ReduceOpLike, agree, check_tensor, combine, finish_avg, flat_view, recv, reduce_op,
    same_layout, send, view,
)


def _tree_rounds(vrank: int, size: int) -> tuple[int | None, list[int]]:
    """Binomial tree rooted at virtual rank 0: (parent, children in the order they are served).

    Rank v receives from v − 2^k where 2^k is v's lowest set bit, then sends to v + 2^j for
    every 2^j < 2^k (largest first), so each round doubles the ranks that hold the data.
    """
    mask, parent = 1, None
    while mask < size:
        if vrank & mask:
            parent = vrank - mask
            break
        mask <<= 1
    children = []
    mask >>= 1
    while mask > 0:
        if vrank + mask < size:
            children.append(vrank + mask)
        mask >>= 1
    return parent, children


def linear_broadcast(tensor: torch.Tensor, src: int, group=None, *,
                     check: bool = True) -> torch.Tensor:
    """Broadcast in place from `src`: the root sends the tensor to every other rank in turn."""
    return _broadcast(tensor, src, group, check, "linear_broadcast", tree=False)


def tree_broadcast(tensor: torch.Tensor, src: int, group=None, *,
                   check: bool = True) -> torch.Tensor:
    """Broadcast in place from `src` along a binomial tree: ⌈log₂ p⌉ rounds of sends."""
    return _broadcast(tensor, src, group, check, "tree_broadcast", tree=True)


def _broadcast(tensor, src, group, check, name, *, tree):
    check_tensor(tensor, name, "tensor")
    g = view(group, name)
    root = g.group_rank(src, name=name, arg="src")
    if g.rank < 0 or g.size == 1:
        return tensor
    if check:
        agree(g, name, numel=tensor.numel(), dtype=tensor.dtype, device=tensor.device, root=root)
    flat, copied = flat_view(tensor)
    vrank = (g.rank - root) % g.size
    real = lambda v: (v + root) % g.size  # noqa: E731  virtual rank -> group rank
    if tree:
        parent, children = _tree_rounds(vrank, g.size)
    else:
        parent = None if vrank == 0 else 0
        children = list(range(1, g.size)) if vrank == 0 else []
    if parent is not None:
        recv(g, flat, real(parent))
    for child in children:
        send(g, flat, real(child))
    if copied:
        tensor.copy_(flat.view_as(tensor))
    return tensor


def linear_reduce(tensor: torch.Tensor, dst: int, group=None, *, op: ReduceOpLike = "sum",
                  check: bool = True) -> torch.Tensor:
    """Reduce into `tensor` on `dst`: the root receives every other rank's tensor in turn.

    Other ranks' tensors are left as they were.
    """
    return _reduce(tensor, dst, group, op, check, "linear_reduce", tree=False)


def tree_reduce(tensor: torch.Tensor, dst: int, group=None, *, op: ReduceOpLike = "sum",
                check: bool = True) -> torch.Tensor:
    """Reduce into `tensor` on `dst` along a binomial tree (partial results flow to the root).

    Other ranks' tensors are left as they were (inner nodes add into a copy).
    """
    return _reduce(tensor, dst, group, op, check, "tree_reduce", tree=True)


def _reduce(tensor, dst, group, op, check, name, *, tree):
    op = reduce_op(op, name)
    check_tensor(tensor, name, "tensor", op)
    g = view(group, name)
    root = g.group_rank(dst, name=name, arg="dst")
    if g.rank < 0:
        return tensor
    if check:
        agree(g, name, numel=tensor.numel(), dtype=tensor.dtype, device=tensor.device, op=op,
              root=root)
    vrank = (g.rank - root) % g.size
    real = lambda v: (v + root) % g.size  # noqa: E731
    if tree:
        parent, children = _tree_rounds(vrank, g.size)
        children = children[::-1]  # the broadcast's order reversed: nearest subtree first
    else:
        parent = None if vrank == 0 else 0
        children = list(range(1, g.size)) if vrank == 0 else []

    flat, copied = flat_view(tensor)
    if children and vrank != 0:
        flat, copied = flat.clone(), False  # an inner node keeps the caller's tensor intact
    add = combine(op)
    if children:
        scratch = torch.empty_like(flat)
        for child in children:
            recv(g, scratch, real(child))
            add(flat, scratch)
    if parent is not None:
        send(g, flat, real(parent))
    elif vrank == 0:
        finish_avg(op, flat, g.size)
        if copied:
            tensor.copy_(flat.view_as(tensor))
    return tensor


def scatter(tensor: torch.Tensor, scatter_list: Sequence[torch.Tensor] | None = None,
            src: int = 0, group=None, *, check: bool = True) -> torch.Tensor:
    """Rank i of the group receives ``scatter_list[i]`` (given on `src` only) into `tensor`.

    Linear: the root sends one piece to each rank in turn; it copies its own.
    """
    name = "scatter"
    check_tensor(tensor, name, "tensor")
    g = view(group, name)
    root = g.group_rank(src, name=name, arg="src")
    if g.rank < 0:
        return tensor
    if g.rank == root:
        same_layout(scatter_list, tensor, name, "scatter_list", g.size)
    elif scatter_list:
        raise ValueError(f"scatter: scatter_list is given on rank {g.peer(g.rank)}, which is not "
                         f"the source ({src}); pass it on the source only")
    if check:
        agree(g, name, numel=tensor.numel(), dtype=tensor.dtype, device=tensor.device, root=root)
    if g.rank == root:
        for i in range(g.size):
            if i == root:
                tensor.copy_(scatter_list[i])
            else:
                send(g, scatter_list[i].contiguous(), i)
    else:
        flat, copied = flat_view(tensor)
        recv(g, flat, root)
        if copied:
            tensor.copy_(flat.view_as(tensor))
    return tensor


def gather(tensor: torch.Tensor, gather_list: Sequence[torch.Tensor] | None = None,
           dst: int = 0, group=None, *, check: bool = True) -> torch.Tensor:
    """``gather_list[i]`` on `dst` receives rank i's `tensor`. Linear: one rank at a time."""
    name = "gather"
    check_tensor(tensor, name, "tensor")
    g = view(group, name)
    root = g.group_rank(dst, name=name, arg="dst")
    if g.rank < 0:
        return tensor
    if g.rank == root:
        same_layout(gather_list, tensor, name, "gather_list", g.size)
    elif gather_list:
        raise ValueError(f"gather: gather_list is given on rank {g.peer(g.rank)}, which is not "
                         f"the destination ({dst}); pass it on the destination only")
    if check:
        agree(g, name, numel=tensor.numel(), dtype=tensor.dtype, device=tensor.device, root=root)
    if g.rank == root:
        for i in range(g.size):
            if i == root:
                gather_list[i].copy_(tensor)
                continue
            out, copied = flat_view(gather_list[i])
            recv(g, out, i)
            if copied:
                gather_list[i].copy_(out.view_as(gather_list[i]))
    else:
        send(g, tensor.contiguous(), root)
    return tensor
