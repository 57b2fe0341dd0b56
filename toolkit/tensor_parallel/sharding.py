"""Who this rank is in its tensor-parallel group, and which slice of a tensor it keeps.

Megatron-LM gives every rank an equal shard: a size n split over a group of p ranks must have
p | n (its ``divide`` asserts it). `divide` keeps that rule but raises a `ValueError` that names
the size, the group size and the rule, instead of an assertion, so a student who builds an MLP
of width 6 on 4 ranks reads why it cannot work.

Without an initialised process group (a plain notebook cell or test), ``group=None`` means one
rank: every layer in this package then runs as its dense twin and sends nothing.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from ..arguments import check_ints

__all__ = ["divide", "group_rank_size", "shard"]


def group_rank_size(group: Any = None) -> tuple[int, int]:
    """``(rank within group, group size)``; ``(0, 1)`` when no process group is initialised."""
    if not (dist.is_available() and dist.is_initialized()):
        if group is not None:
            raise RuntimeError("a tensor-parallel group was given but torch.distributed is not "
                               "initialised: start the ranks with toolkit.launch.spawn")
        return 0, 1
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError(f"rank {dist.get_rank()} is not a member of the tensor-parallel group "
                         f"{dist.get_process_group_ranks(group)}")
    return rank, dist.get_world_size(group)


def divide(n: int, p: int, what: str) -> int:
    """``n // p``, or a `ValueError` naming `what` when `p` does not divide `n`."""
    if n % p != 0:
        raise ValueError(
            f"{what}={n} is not divisible by the tensor-parallel size {p}: Megatron-style tensor "
            f"parallelism gives every rank an equal shard ({what} / {p}), so it requires "
            f"divisibility; choose a size that is a multiple of {p} or fewer ranks")
    return n // p


def shard(tensor: Tensor, dim: int, *, group: Any = None, what: str = "size") -> Tensor:
    """This rank's contiguous slice of `tensor` along `dim` (a view; `.clone()` to keep it).

    Rank r of p keeps elements ``[r * n/p, (r+1) * n/p)``: rows of a column-parallel weight,
    columns of a row-parallel weight, positions of a sequence-parallel activation.
    """
    rank, size = group_rank_size(group)
    n = tensor.shape[dim]
    step = divide(n, size, what)
    return tensor.narrow(dim, rank * step, step)


def _check_features(owner: str, **sizes: int) -> None:
    """Layer sizes: ints >= 1 (`toolkit.arguments.check_ints`)."""
    check_ints(owner, expected="a positive int", **sizes)


def _contiguous_copy(t: Tensor) -> Tensor:
    # Collectives write in place and need dense memory; a gradient handed to backward may be an
    # expanded view (the backward of .sum() is ones expanded) or shared with other consumers.
    return t.clone(memory_format=torch.contiguous_format)
