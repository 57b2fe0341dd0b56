"""The ideal timeline of a schedule: when every op would start and end, given op times.

Each stage runs its ops in order; an op starts when the stage is free and its input has arrived
(the producing op's end plus `comm` seconds when it ran on another stage). With every stage
equally fast and `comm` = 0 this reproduces the bubble formulas of `toolkit.cost.bubble`
exactly (tested). The table has the same columns as the executor's measured one, so the two
can be drawn and compared side by side (`toolkit.viz.pipeline`).

Op times: `forward` and `backward` per micro-batch through a whole stage, and `weight` for the
weight-gradient part of the backward. In a schedule without W ops a B is the whole backward and
takes `backward` + `weight`; with W ops (split backward, Qi et al. 2024) B takes `backward` and
W takes `weight`. A chunk op takes `Schedule.share` of it (1/v interleaved). `cost(stage, op)`
overrides all of this per op (token slices of unequal length, TeraPipe).

Columns of a timeline table: ``stage, op ("F"/"B"/"W"), mb, chunk, start, end, duration``
(seconds; measured tables add ``wait``, the time spent waiting for the input message).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import pandas as pd

from .schedules import Op, Schedule
from .validate import check_schedule, needs, run_order

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


def simulate(schedule: Schedule, *, forward: float | Sequence[float] = 1.0,
             backward: float | Sequence[float] = 2.0, weight: float | Sequence[float] = 0.0,
             comm: float = 0.0, cost: Callable[[int, Op], float] | None = None) -> Timeline:
    """The ideal timeline of `schedule` (checked first with `check_schedule`).

    `forward`, `backward` and `weight` are the times of one micro-batch through one whole stage
    (a float, or one per stage for unbalanced stages): F takes `forward`; B takes `backward`,
    plus `weight` when the schedule has no W ops (B is then the whole backward); W takes
    `weight`. A chunk op takes `Schedule.share` of its stage's time. `comm` is the time of one
    message between stages. `cost(stage, op)`, when given, is every op's time instead. Backward
    twice the forward is the usual rule of thumb (two matrix products per product of the
    forward; Kaplan et al. 2020); split, that is about one for B and one for W.
    """
    s = check_schedule(schedule)
    t_f, t_b = _per_stage(forward, s.p, "forward"), _per_stage(backward, s.p, "backward")
    t_w = _per_stage(weight, s.p, "weight")
    if comm < 0:
        raise ValueError(f"simulate: comm must be >= 0 seconds, got {comm}")
    split = s.split

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
        return (t_b[r] + (0.0 if split else t_w[r])) * s.share

    order, _ = run_order(s)
    free = [0.0] * s.p
    end: dict[tuple, float] = {}
    rows = []
    for r, i in order:                  # an order in which every op's input exists before it
        op = s.stages[r][i]
        ready = free[r]
        dep = needs(s, r, op)
        if dep is not None:
            ready = max(ready, end[dep] + (comm if dep[0] != r else 0.0))
        took = duration(r, op)
        end[r, op] = ready + took
        free[r] = ready + took
        rows.append((r, op.kind, op.mb, op.chunk, ready, ready + took, took))
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


__all__ = ["COLUMNS", "Timeline", "idle_fraction", "simulate", "stage_times"]
