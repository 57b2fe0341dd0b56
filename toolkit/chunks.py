"""The split of n elements into p nearly equal chunks that every part of the toolkit shares.

The rule is ``torch.tensor_split``'s (PyTorch documentation, `torch.tensor_split`, "indices_or_
sections" as an int): with n = q·p + r, the first r chunks hold q + 1 elements and the others q.
Collectives cut a tensor into per-rank chunks with it, the pipeline cuts layers into stages and
context parallelism a sequence into shards; every rank computes the same split from (n, p)
alone, with no message.

Shapes: ``chunk_sizes(n, p)`` is a list of p ints that sum to n; ``chunk_bounds(n, p)`` the p
(start, stop) offsets of those chunks, in order. This module imports nothing from the toolkit,
so every layer may use it.
"""

from __future__ import annotations


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


__all__ = ["chunk_bounds", "chunk_sizes"]
