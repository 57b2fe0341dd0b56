"""Lab 01's inputs and rank-side calls: how each check calls the student's functions.

Imported by the grader, which makes every rank's input with `make_inputs` from a seed drawn
from the grade's secret, and copied into the sandbox (as `_lab_harness`), where each call
receives its own rank's input alone (`call.inputs`): no rank can rebuild another's. Holds no
answers.

A case is a dict: ``world_size``, ``numel`` (or ``shape``), ``dtype``, ``seed`` (the grader's
only) and, for broadcast, ``src``.
"""

from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
          "bfloat16": torch.bfloat16}


def chunk_bounds(numel: int, world_size: int) -> list[tuple[int, int]]:
    """(start, end) of each rank's chunk: the split of `torch.tensor_split` (the first
    numel % p chunks one element longer), which the student file's `chunk_bounds` also makes."""
    # A meta tensor: tensor_split's sizes without allocating anything, on any device.
    sizes = [len(c) for c in torch.empty(numel, device="meta").tensor_split(world_size)]
    starts = [sum(sizes[:i]) for i in range(world_size)]
    return [(s, s + n) for s, n in zip(starts, sizes)]


def make_input(case: dict, gen: torch.Generator) -> torch.Tensor:
    """One rank's full-size tensor: normal values drawn from `gen` (that rank's stream) on the
    generator's device, the CPU (the grader computes expected values from the same draw); a
    rank moves it to its device (`call.device`)."""
    shape = case.get("shape") or [case["numel"]]
    draw = torch.randn(shape, generator=gen, dtype=torch.float64, device=gen.device)
    return draw.to(DTYPES[case.get("dtype", "float32")])


def make_inputs(case: dict, world_size: int) -> list[torch.Tensor]:
    """Every rank's full-size tensor (all-gather passes chunk_bounds[rank] of it). Grader side
    only: rank r's stream is seeded by a hash of the case's seed and ("rank", r)
    (`autograder.seeds`), so a rank that recovers its own seed learns no other rank's."""
    from autograder.seeds import generator  # grader side: ranks never call make_inputs

    seed = int(case.get("seed", 0))
    return [make_input(case, generator(seed, "rank", r)) for r in range(world_size)]


def _all_reduce(student, call):
    t = call.inputs.to(call.device)
    student.ring_all_reduce(t)
    return t


def _broadcast(student, call):
    t = call.inputs.to(call.device)
    student.tree_broadcast(t, call.case.get("src", 0) % call.world_size)
    return t


def _reduce_scatter(student, call):
    x = call.inputs.to(call.device)
    a, b = chunk_bounds(x.numel(), call.world_size)[call.rank]
    out = torch.full((b - a,), float("nan"), dtype=x.dtype, device=x.device)
    student.ring_reduce_scatter(out, x)
    return out


def _all_gather(student, call):
    full = call.inputs.to(call.device)
    a, b = chunk_bounds(full.numel(), call.world_size)[call.rank]
    mine = full.reshape(-1)[a:b].clone()
    out = torch.full((full.numel(),), float("nan"), dtype=full.dtype, device=full.device)
    student.ring_all_gather(out, mine)
    return out


CALLS = {"all_reduce": _all_reduce, "broadcast": _broadcast,
         "reduce_scatter": _reduce_scatter, "all_gather": _all_gather}
