"""Chen et al.'s model of checkpointed memory: segments of k layers, O(√L) at the optimum.

Chen, Xu, Zhang & Guestrin, 2016, "Training Deep Nets with Sublinear Memory Cost"
(arXiv:1604.06174), sections 3-4. L layers, each keeping c bytes of internals for its backward
and taking an input of a bytes. Checkpointing in segments of k layers keeps only each segment's
input all along and reruns one segment's forward at a time during backward:

    memory(k) = ⌈L/k⌉·a  +  k·c          (inputs held, one segment's internals rerun)
    memory(∅) = L·c                      (no checkpointing)

In Chen's units (a = c = 1) that is ⌈L/k⌉ + k, smallest at k = √L: O(√L) memory instead of
O(L), for one extra forward per step whatever k is (every segment but none of the layers
outside segments runs forward twice). In general the optimum is near k = √(L·a/c): a
transformer block keeps far more inside (Korthikanti et al. 2022: 34·s·b·h + 5·a·s²·b bytes)
than its input (2·s·b·h), so there it is k = 1, checkpointing every block.

Pure arithmetic: numbers in, numbers out (`toolkit.recompute` builds the checkpointed models,
`toolkit.experiments.recompute` measures them against this).
"""

from __future__ import annotations

import math

from ..arguments import check_int

__all__ = ["best_every", "chen_memory", "segment_sizes"]


def segment_sizes(n_layer: int, every: int | None) -> list[int]:
    """Blocks per checkpointed segment, in order; ``[]`` for ``every=None`` (no checkpointing).

    ``every=k`` groups consecutive blocks k at a time (the last segment may be shorter).
    """
    if every is None:
        return []
    check_int("", "every", every, expected="None (no checkpointing) or an int >= 1 (blocks per "
                                           "checkpointed segment)")
    return [min(every, n_layer - i) for i in range(0, n_layer, every)]


def chen_memory(n_layer: int, every: int | None, *, input_bytes: float = 1.0,
                block_bytes: float = 1.0) -> float:
    """Peak activation memory of L blocks checkpointed in segments of `every` (module docstring).

    No checkpointing: L·c, every block's internals c = `block_bytes`. Segments of k: ⌈L/k⌉ segment
    inputs of a = `input_bytes` each, held all along, plus one segment's k blocks of internals
    rerun during its backward: ⌈L/k⌉·a + k·c. Leaves out what lies outside the blocks
    (embeddings, head, loss).
    """
    if every is None:
        return n_layer * block_bytes
    return len(segment_sizes(n_layer, every)) * input_bytes + min(every, n_layer) * block_bytes


def best_every(n_layer: int, *, input_bytes: float = 1.0, block_bytes: float = 1.0) -> int:
    """The segment length k with the least `chen_memory`: √L when an input costs as much as a
    block's internals (Chen et al., section 4), about √(L·a/c) in general; ties go to the k
    nearest √(L·a/c)."""
    check_int("best_every", "n_layer", n_layer)
    return min(range(1, n_layer + 1), key=lambda k: (
        chen_memory(n_layer, k, input_bytes=input_bytes, block_bytes=block_bytes),
        abs(k - math.sqrt(n_layer * input_bytes / block_bytes))))
