"""The collectives the courier computes for ranks, from every member's contribution.

Semantics follow torch.distributed (in place, results in rank order of the group), with the
arithmetic done once, here, in float64 for floating types (cast back to each tensor's dtype)
and in int64 for integers: `reduce` of p tensors is the fold of an associative op over the
members in group order. The bytes a backend would have moved (ring or tree) do not exist here:
the courier records what each rank passed in.

Each function takes the members' input tensors (a list per member, in group order) and their
output specs ((dtype, shape) per output tensor) and returns each member's output tensors, or
raises `CollectiveError` with words a student understands when the members disagree.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from .channel import DTYPES


class CollectiveError(ValueError):
    """The members' calls do not fit together (sizes, dtypes, roots or counts)."""


_FOLD: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "sum": torch.add, "avg": torch.add, "product": torch.mul, "min": torch.minimum,
    "max": torch.maximum, "band": torch.bitwise_and, "bor": torch.bitwise_or,
    "bxor": torch.bitwise_xor}
Inputs = list[list[torch.Tensor]]
Specs = list[list[tuple[str, list[int]]]]


def _wide(t: torch.Tensor) -> torch.Tensor:
    if t.dtype.is_floating_point:
        return t.double()
    if t.dtype.is_complex:
        return t.to(torch.complex128)
    return t if t.dtype == torch.bool else t.long()


def combine(tensors: list[torch.Tensor], how: str) -> torch.Tensor:
    """Fold `tensors` (same numel and dtype) with `how`; the result has the first's dtype."""
    if how not in _FOLD:
        raise CollectiveError(f"the reduce operation {how!r} is not supported by the grader")
    first = tensors[0]
    if how.startswith("b") and (first.dtype.is_floating_point or first.dtype.is_complex):
        raise CollectiveError(f"{how.upper()} needs an integer or bool tensor, got {first.dtype}")
    if how == "avg" and not (first.dtype.is_floating_point or first.dtype.is_complex):
        raise CollectiveError(f"AVG needs a floating-point tensor, got {first.dtype}")
    acc = _wide(first.reshape(-1))
    for t in tensors[1:]:
        acc = _FOLD[how](acc, _wide(t.reshape(-1)))
    if how == "avg":
        acc = acc / len(tensors)
    return acc.to(first.dtype)


def _same(tensors: list[torch.Tensor], what: str) -> None:
    first = tensors[0]
    for i, t in enumerate(tensors[1:], 1):
        if t.numel() != first.numel() or t.dtype != first.dtype:
            raise CollectiveError(
                f"{what}: group rank 0 passed {first.numel():,} elements of "
                f"{str(first.dtype).removeprefix('torch.')}, group rank {i} passed "
                f"{t.numel():,} of {str(t.dtype).removeprefix('torch.')}")


def _fit(t: torch.Tensor, spec: tuple[str, list[int]], what: str, member: int) -> torch.Tensor:
    dtype, shape = spec
    if t.numel() != math.prod(shape) or DTYPES.get(dtype) != t.dtype:
        raise CollectiveError(f"{what}: group rank {member}'s output holds {math.prod(shape):,} "
                              f"elements of {dtype}; the result has {t.numel():,} of "
                              f"{str(t.dtype).removeprefix('torch.')}")
    return t.reshape(shape)


def _counts(inputs: Inputs, what: str) -> int:
    n = {len(x) for x in inputs}
    if len(n) != 1:
        raise CollectiveError(f"{what}: the ranks passed different numbers of tensors {sorted(n)}")
    return n.pop()


def all_reduce(inputs: Inputs, specs: Specs, *, how: str, **_) -> Inputs:
    out = []
    for k in range(_counts(inputs, "all_reduce")):
        column = [x[k] for x in inputs]
        _same(column, "all_reduce")
        out.append(combine(column, how))
    return [[_fit(r, s, "all_reduce", m) for r, s in zip(out, specs[m])]
            for m in range(len(inputs))]


def reduce(inputs: Inputs, specs: Specs, *, how: str, root: int, **_) -> Inputs:
    result = all_reduce(inputs, specs, how=how)
    return [result[m] if m == root else [t.clone() for t in inputs[m]] for m in range(len(inputs))]


def broadcast(inputs: Inputs, specs: Specs, *, root: int, **_) -> Inputs:
    _counts(inputs, "broadcast")
    return [[_fit(t.clone(), s, "broadcast", m) for t, s in zip(inputs[root], specs[m])]
            for m in range(len(inputs))]


def barrier(inputs: Inputs, specs: Specs, **_) -> Inputs:
    return [[] for _ in inputs]


def all_gather(inputs: Inputs, specs: Specs, **_) -> Inputs:
    p = len(inputs)
    if _counts(inputs, "all_gather") != 1 or any(len(s) != p for s in specs):
        raise CollectiveError(f"all_gather: every rank passes one tensor and a list of {p}")
    return [[_fit(inputs[j][0].clone(), specs[m][j], "all_gather", m) for j in range(p)]
            for m in range(p)]


def all_gather_single(inputs: Inputs, specs: Specs, **_) -> Inputs:
    if _counts(inputs, "all_gather_single") != 1:
        raise CollectiveError("all_gather_single: one input tensor per rank")
    column = [x[0] for x in inputs]
    _same(column, "all_gather_single (all_gather_into_tensor)")
    whole = torch.cat([t.reshape(-1) for t in column])
    return [[_fit(whole.clone(), specs[m][0], "all_gather_single (all_gather_into_tensor)", m)]
            for m in range(len(inputs))]


def reduce_scatter(inputs: Inputs, specs: Specs, *, how: str, **_) -> Inputs:
    p = len(inputs)
    if _counts(inputs, "reduce_scatter") != p:
        raise CollectiveError(f"reduce_scatter: every rank passes a list of {p} tensors")
    out = []
    for m in range(p):
        column = [x[m] for x in inputs]
        _same(column, "reduce_scatter")
        out.append([_fit(combine(column, how), specs[m][0], "reduce_scatter", m)])
    return out


def reduce_scatter_single(inputs: Inputs, specs: Specs, *, how: str, **_) -> Inputs:
    p, what = len(inputs), "reduce_scatter_single (reduce_scatter_tensor)"
    if _counts(inputs, what) != 1:
        raise CollectiveError(f"{what}: one input tensor per rank")
    column = [x[0].reshape(-1) for x in inputs]
    _same(column, what)
    n = column[0].numel()
    if n % p:
        raise CollectiveError(f"{what}: the input's {n:,} elements do not split into {p} equal "
                              "chunks (the input is world_size times the output)")
    size = n // p
    return [[_fit(combine([c[m * size:(m + 1) * size] for c in column], how), specs[m][0],
                  what, m)] for m in range(p)]


def gather(inputs: Inputs, specs: Specs, *, root: int, **_) -> Inputs:
    p = len(inputs)
    if _counts(inputs, "gather") != 1 or len(specs[root]) != p:
        raise CollectiveError(f"gather: every rank passes one tensor, the root a list of {p}")
    return [[_fit(inputs[j][0].clone(), specs[root][j], "gather", root) for j in range(p)]
            if m == root else [] for m in range(p)]


def scatter(inputs: Inputs, specs: Specs, *, root: int, **_) -> Inputs:
    p = len(inputs)
    if len(inputs[root]) != p:
        raise CollectiveError(f"scatter: the root passes a list of {p} tensors")
    return [[_fit(inputs[root][m].clone(), specs[m][0], "scatter", m)] for m in range(p)]


COLLECTIVES = {"all_reduce": all_reduce, "reduce": reduce, "broadcast": broadcast,
               "barrier": barrier, "all_gather": all_gather,
               "all_gather_single": all_gather_single, "reduce_scatter": reduce_scatter,
               "reduce_scatter_single": reduce_scatter_single, "gather": gather,
               "scatter": scatter}
ROOTED = frozenset({"reduce", "broadcast", "gather", "scatter"})

__all__ = ["COLLECTIVES", "CollectiveError", "ROOTED", "combine"]
