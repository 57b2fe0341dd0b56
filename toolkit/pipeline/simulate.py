"""The ideal timeline of a schedule: when every op would start and end, given op times.

Each stage runs its ops in order; an op starts when the stage is free and its input has arrived
(the producing op's end plus `comm` seconds when it ran on another stage). With every stage
equally fast and `comm` = 0 this reproduces the bubble formulas of `toolkit.cost.bubble`
exactly (tested). The table has the same columns as the executor's measured one, so the two
can be drawn and compared side by side (`toolkit.viz.pipeline`).

Op times: `forward` and `backward` per micro-batch through a whole stage, and `weight` for the
weight-gradient part of the backward. A B with no W on its stage is the whole backward and
takes `backward` + `weight`; a B whose W is on the stage (split backward, Qi et al. 2024) takes
`backward` and its W takes `weight`. A chunk op takes `Schedule.share` of it (1/v interleaved,
1/2 in the V layout). `cost(stage, op)` overrides all of this per op (token slices of unequal
length, TeraPipe). `pairs=True` starts DualPipe's forward-and-backward pairs together.

Columns of a timeline table: ``stage, op ("F"/"B"/"W"), mb, chunk, start, end, duration``
(seconds; measured tables add ``wait``, the time spent waiting for the input message).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import pandas as pd

from .schedules import Op, Schedule
from .dependencies import needs
from .validate import check_schedule

COLUMNS = ["stage", "op", "mb", "chunk", "start", "end", "duration"]
"""Columns every timeline table has."""


@dataclass(frozen=True)
class Timeline:
    """A timeline table and what it adds up to."""

    table: pd.DataFrame
    """One row per op (`COLUMNS`)."""
    makespan: float
    """From the first op's start to the last op's end, seconds."""
    bubble: float
    """Idle fraction: 1 − (time spent computing) / (p · makespan)."""


def _per_stage(value: float | Sequence[float], p: int, name: str) -> list[float]:
    values = [float(value)] * p if isinstance(value, (int, float)) else [float(x) for x in value]
    if len(values) != p or any(x < 0 for x in values):
        raise ValueError(f"simulate: {name} must be a time >= 0 or one per stage ({p}), "
                         f"got {value!r}")
    return values


def _units(ops: Sequence[Op], pairs: bool) -> list[tuple[int, ...]]:
    """A stage's steps grouped into what starts as one: single ops, or, with `pairs`, an F
    followed directly by a B of another chunk (DualPipe's overlapped F&B)."""
    out, i = [], 0
    while i < len(ops):
        if (pairs and i + 1 < len(ops) and ops[i].kind == "F" and ops[i + 1].kind == "B"
                and ops[i].chunk != ops[i + 1].chunk):
            out.append((i, i + 1))
            i += 2
        else:
            out.append((i,))
            i += 1
    return out


def simulate(schedule: Schedule, *, forward: float | Sequence[float] = 1.0,
             backward: float | Sequence[float] = 2.0, weight: float | Sequence[float] = 0.0,
             comm: float = 0.0, cost: Callable[[int, Op], float] | None = None,
             pairs: bool = False) -> Timeline:
    """The ideal timeline of `schedule` (checked first with `check_schedule`).

    `forward`, `backward` and `weight` are the times of one micro-batch through one whole stage
    (a float, or one per stage for unbalanced stages): F takes `forward`; B takes `backward`,
    plus `weight` when it has no W on its stage (B is then the whole backward); W takes
    `weight`. A chunk op takes `Schedule.share` of its stage's time. `comm` is the time of one
    message between stages. `cost(stage, op)`, when given, is every op's time instead. Backward
    twice the forward is the usual rule of thumb (two matrix products per product of the
    forward; Kaplan et al. 2020); split, that is about one for B and one for W.

    `pairs`: an F that its stage follows directly with a B of its other chunk starts only once
    both inputs are in, and the two run back to back, as DualPipe runs a forward and a
    backward overlapped (DeepSeek-V3 report, section 3.2.1: both messages are received before
    the pair computes). Without it every op starts as soon as its own input is in, as the
    executor runs them.
    """
    s = check_schedule(schedule)
    t_f, t_b = _per_stage(forward, s.p, "forward"), _per_stage(backward, s.p, "backward")
    t_w = _per_stage(weight, s.p, "weight")
    if comm < 0:
        raise ValueError(f"simulate: comm must be >= 0 seconds, got {comm}")
    split = [s.split_on(r) for r in range(s.p)]

    def duration(r: int, op: Op) -> float:
        if cost is not None:
            t = float(cost(r, op))
            if not t >= 0:
                raise ValueError(f"simulate: cost({r}, {op}) must be a time >= 0, got {t!r}")
            return t
        if op.kind == "F":
            return t_f[r] * s.share
        if op.kind == "W":
            return t_w[r] * s.share
        return (t_b[r] + (0.0 if (op.mb, op.chunk) in split[r] else t_w[r])) * s.share

    units = [_units(ops, pairs) for ops in s.stages]
    pos, free = [0] * s.p, [0.0] * s.p
    end: dict[tuple, float] = {}
    rows = []
    progress = True
    while progress:                     # each stage runs its units in order, inputs first
        progress = False
        for r in range(s.p):
            while pos[r] < len(units[r]):
                ops = [s.stages[r][i] for i in units[r][pos[r]]]
                deps = [d for d in (needs(s, r, op) for op in ops)
                        if d is not None and d not in {(r, op) for op in ops}]
                if any(d not in end for d in deps):
                    break
                ready = max([free[r]] + [end[d] + (comm if d[0] != r else 0.0) for d in deps])
                for op in ops:
                    took = duration(r, op)
                    end[r, op] = ready + took
                    rows.append((r, op.kind, op.mb, op.chunk, ready, ready + took, took))
                    ready += took
                free[r], pos[r], progress = ready, pos[r] + 1, True
    stuck = [r for r in range(s.p) if pos[r] < len(units[r])]
    if stuck:                           # only pairs can do this: check_schedule ran the ops
        raise ValueError(f"simulate: with pairs=True stage {stuck[0]} waits forever at step "
                         f"{units[stuck[0]][pos[stuck[0]]][0]}: a paired B needs what its own "
                         f"F sends; run this schedule with pairs=False")
    table = pd.DataFrame(rows, columns=COLUMNS).sort_values(["stage", "start"], kind="stable")
    return Timeline(table.reset_index(drop=True), *_span_and_bubble(table, s.p))


def _span_and_bubble(table: pd.DataFrame, p: int | None) -> tuple[float, float]:
    p = p if p is not None else int(table["stage"].max()) + 1
    span = float(table["end"].max() - table["start"].min())
    busy = float(table["duration"].sum())
    return span, (1.0 - busy / (p * span)) if span > 0 else 0.0


def idle_fraction(table: pd.DataFrame, p: int | None = None) -> float:
    """Bubble of any timeline table (simulated or measured): 1 − busy / (p · makespan), where
    busy is the summed duration of all ops and p the number of stages (default: from the
    table)."""
    return _span_and_bubble(table, p)[1]


def idle_within(table: pd.DataFrame, p: int | None = None) -> list[float]:
    """Per stage, its idle time between its own first op and its last: what is left of the
    bubble once the next step's fill may overlap this step's drain (the zero-bubble papers'
    count, with the optimizer step free of synchronisations)."""
    p = p if p is not None else int(table["stage"].max()) + 1
    out = []
    for r in range(p):
        t = table[table["stage"] == r]
        out.append(float(t["end"].max() - t["start"].min() - t["duration"].sum()) if len(t)
                   else 0.0)
    return out


def stage_times(table: pd.DataFrame, v: float = 1, *, per_stage: bool = False,
                weight: bool = False) -> tuple:
    """Mean (forward, backward) time of one micro-batch through a whole stage in a timeline
    table: the mean op duration times v (1 / `Schedule.share`); with `per_stage`, one value
    per stage; with `weight`, (forward, backward, weight), W from the table's W ops (0 when
    there are none). Feed them to `simulate` for the ideal that matches a measured run: what
    is left between the two is communication and waiting."""
    kinds = ("F", "B", "W") if weight else ("F", "B")
    if not per_stage:
        means = table.groupby("op")["duration"].mean()
        return tuple(float(means.get(k, 0.0)) * v for k in kinds)
    means = table.groupby(["stage", "op"])["duration"].mean()
    p = int(table["stage"].max()) + 1
    return tuple([float(means.get((r, k), 0.0)) * v for r in range(p)] for k in kinds)


__all__ = ["COLUMNS", "Timeline", "idle_fraction", "idle_within", "simulate", "stage_times"]
