"""TeraPipe: a pipeline over token slices of one sequence instead of micro-batches of samples.

Li, Zhuang, Guo, Zhuo, Zhang, Song & Stoica, "TeraPipe: Token-Level Pipeline Parallelism for
Training Large-Scale Language Models", ICML 2021. In a causal language model token t depends
only on tokens ≤ t, so stage k can start on the first slice of a sequence while stage k − 1
computes the second one (section 3.1). The schedule's "micro-batches" are n slices of one
sequence, and two dependencies join the usual ones, both on the same stage: slice j's forward
attends to the keys and values the forwards of slices < j stored, and slice j's backward needs
the gradients that the backwards of slices > j send back into its keys and values. So every
stage runs the forwards in slice order and the backwards in reverse order: GPipe's shape, with
the backward reversed, and every slice's activations held until its backward.

Slices need not be equal: a later slice attends to more tokens, so equal slices make later ops
longer. TeraPipe chooses the slice lengths by dynamic programming (section 3.3); the cost of a
slicing and that search are in `toolkit.cost.token_slices`, and `simulate(..., cost=...)` runs
the schedule with per-slice times.

    s = terapipe(4, 8)   # every stage: F0 … F7, B7 … B0 (sequence=True)
"""

from __future__ import annotations

from ..cost.bubble import check_sizes
from .schedules import Op, Schedule


def terapipe(p: int, n: int) -> Schedule:
    """TeraPipe's schedule (Li et al. 2021, section 3) for p stages and n token slices of one
    sequence: every stage runs F0 … F(n−1), then B(n−1) … B0."""
    check_sizes("terapipe", p, n)
    row = tuple(Op("F", j) for j in range(n)) + tuple(Op("B", j) for j in reversed(range(n)))
    return Schedule(tuple(row for _ in range(p)), m=n, name="terapipe", sequence=True)


__all__ = ["terapipe"]
