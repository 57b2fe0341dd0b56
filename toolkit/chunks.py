"""The split of n elements into p nearly equal chunks that every part of the toolkit shares.

The rule is ``torch.tensor_split``'s (PyTorch documentation, `torch.tensor_split`, "indices_or_
sections" as an int): with n = q·p + r, the first r chunks hold q + 1 elements and the others q.
Collectives cut a tensor into per-rank chunks with it, the pipeline cuts layers into stages and
context parallelism a sequence into shards; every rank computes the same split from (n, p)
alone, with no message.

Shapes: ``chunk_sizes(n, p)`` is a list of p ints that sum to n; ``chunk_bounds(n, p)`` the p
(start, stop) offsets of those chunks, in order. This module imports nothing from the toolkit,
so every layer may use it. `ring_slices` cuts a ring's chunks into the sliced ring's slices
(`toolkit.collectives.sliced_ring`) by the same kind of rule.
"""

from __future__ import annotations

SLICE_BYTES = 4 << 20
"""Default slice size in bytes (4 MiB), chosen by measurement on a 2-core CPU with gloo (the
sweep in lesson 03 and `benchmarks/collectives.py --slices`): here one point-to-point message
costs some 0.4-0.8 ms of CPU, mostly in the kernel (system calls and wake-ups of processes
sharing two cores), so a few large slices beat many small ones. CPU time per 16 and 64 MB call
(median of 9, nice -20): 1 MiB slices cost 23-55 % more than 4 MiB ones at 2 and 4 ranks,
256 KiB ones about 5×; 2-8 MiB were within the noise of one another. The α-β-γ model
(`toolkit.cost.slicing`) agrees: the best count S* = √(nγ/(2pα)) is small when α is large. A
GPU cluster would pick its own (NCCL slices far finer)."""


def chunk_sizes(numel: int, parts: int) -> list[int]:
    """Sizes of `parts` nearly equal chunks of `numel` elements, larger ones first.

    The same split as ``torch.tensor_split``: with n = q·parts + r the first r chunks hold q + 1
    elements. Every rank computes the same split from (numel, parts) alone.
    """
    if parts < 1:
        raise ValueError(f"chunk_sizes(parts={parts}) must be >= 1")
    if numel < 0:
        raise ValueError(f"chunk_sizes(numel={numel}) must be >= 0")
    q, r = divmod(numel, parts)
    return [q + 1 if i < r else q for i in range(parts)]


def chunk_bounds(numel: int, parts: int) -> list[tuple[int, int]]:
    """(start, stop) element offsets of each chunk of `chunk_sizes`."""
    bounds, start = [], 0
    for size in chunk_sizes(numel, parts):
        bounds.append((start, start + size))
        start += size
    return bounds



def ring_slices(numel: int, p: int, element_size: int, slice_bytes: int = SLICE_BYTES) -> int:
    """S, the slices per chunk: ⌈(largest chunk in bytes) / slice_bytes⌉, at least 1.

    A function of (numel, p, element size, slice_bytes) only, so every rank cuts every chunk the
    same way and the k-th slice a rank sends is the k-th slice its neighbour receives.
    """
    if slice_bytes < 1:
        raise ValueError(f"slice_bytes={slice_bytes} must be >= 1 (bytes per slice)")
    largest = max(chunk_sizes(numel, p)) if numel else 0
    per_slice = max(1, slice_bytes // element_size)
    return max(1, -(-largest // per_slice))


__all__ = ["SLICE_BYTES", "chunk_bounds", "chunk_sizes", "ring_slices"]
