"""Which samples each data-parallel rank trains on: the rule of torch's `DistributedSampler`.

Data parallelism needs every rank to see a different, equally long part of the data each epoch
(Li et al., "PyTorch Distributed", VLDB 2020, §2: each process takes its own shard of the input).
PyTorch's `torch.utils.data.DistributedSampler` (torch/utils/data/distributed.py), which
PyTorch Lightning injects into every training DataLoader, deals the samples out like cards:

    order    = randperm(n, generator seeded with seed + epoch)   if shuffle   else 0, 1, ..., n-1
    m        = ⌈n / p⌉ samples per rank (drop_last: ⌊n / p⌋)
    order    = order padded to p·m with its own first elements (drop_last: cut to p·m)
    rank r   ← order[r], order[r + p], order[r + 2p], ...                       (m indices)

so the ranks together cover every sample once per epoch (some twice when p does not divide n),
and a new epoch reshuffles only if the caller advances `epoch` (`set_epoch` in torch; Lightning
calls it for you). Lesson 04 instead gives rank r the r-th contiguous slice, in order, every
epoch: the same gradient average per step only if the batches are the same, which they are not.

Shapes: ``shard_indices(n, ...)`` is a list of m ints in [0, n).
"""

from __future__ import annotations

import math

import torch

from ..arguments import check_int

__all__ = ["samples_per_rank", "shard_indices"]


def samples_per_rank(n: int, world_size: int, *, drop_last: bool = False) -> int:
    """m: how many samples each of `world_size` ranks gets from `n` per epoch."""
    check_int("samples_per_rank", "n", n, low=1)
    check_int("samples_per_rank", "world_size", world_size, low=1)
    if drop_last and n % world_size:
        if n < world_size:
            raise ValueError(f"samples_per_rank: drop_last with n={n} < world_size={world_size} "
                             "leaves every rank without samples; use drop_last=False")
        return n // world_size
    return math.ceil(n / world_size)


def shard_indices(n: int, *, rank: int, world_size: int, epoch: int = 0, seed: int = 0,
                  shuffle: bool = True, drop_last: bool = False) -> list[int]:
    """The sample indices rank `rank` trains on in `epoch`, in order, as torch's
    ``DistributedSampler(dataset, world_size, rank, shuffle, seed, drop_last)`` after
    ``set_epoch(epoch)`` yields them (module docstring)."""
    m = samples_per_rank(n, world_size, drop_last=drop_last)
    check_int("shard_indices", "rank", rank, low=0, high=world_size - 1)
    check_int("shard_indices", "epoch", epoch, low=0)
    if shuffle:
        # A CPU generator, as torch's sampler uses: every rank and device draws the same
        # permutation (a CUDA generator draws another); the indices are host data anyway.
        gen = torch.Generator().manual_seed(seed + epoch)
        order = torch.randperm(n, generator=gen, device=gen.device).tolist()
    else:
        order = list(range(n))
    total = m * world_size
    if total > n:  # pad with the order's own first elements, repeated if need be
        order = (order * math.ceil(total / n))[:total]
    return order[:total][rank::world_size]
