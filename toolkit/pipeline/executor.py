"""Run a pipeline schedule on real ranks: stages by layer, activations and gradients by isend.

`run_pipeline(layers, x, y, schedule=..., p=..., m=...)` spawns p gloo ranks. Rank r builds its
chunks from the layers it owns (`assign_layers`), splits the batch into m micro-batches
(`torch.tensor_split`: the first B mod m are one row longer), and runs its list of the
`Schedule` in order (`toolkit.pipeline.stage.run_stage`, which a lab can spawn itself): each op
receives its input, computes, and sends its output (`toolkit.pipeline.messages`).

Sends never block, so a schedule that passes `check_schedule` cannot deadlock here. Every op is
timed (``time.perf_counter``, one system-wide monotonic clock for all ranks on a machine):
``wait`` is the time blocked on the input message, ``start``/``end`` the compute. The measured
table has the simulator's columns (`toolkit.pipeline.simulate`), in seconds from the first op,
and `PipelineRun.peak_bytes` the most bytes of saved activations each stage held at once.

Any valid schedule runs: W ops (ZB-H1: the backward split into input and weight gradients,
`toolkit.pipeline.compute` says how), Chimera's two pipelines (each rank holds two stages; the
replicas' gradients are summed at the end), token slices of one sequence (TeraPipe: a layer
that carries the keys and values of earlier slices, `token_layers.SlicedAttention`, keeps them
between ops, and is told when a sequence starts).

Parameters shared by layers on different ranks (tied weights) are not supported: each rank would
hold only its share of the gradient.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import pandas as pd
from torch import Tensor, nn

from ..arguments import check_ints
from ..launch import spawn
from .catalog import make_schedule
from .schedules import Schedule
from .simulate import COLUMNS, idle_fraction
from .stage import LossFn, assign_layers, run_stage
from .validate import check_schedule


@dataclass
class PipelineRun:
    """What `run_pipeline` measured."""

    schedule: Schedule
    """The schedule that ran."""
    table: pd.DataFrame
    """One row per op: ``stage, op, mb, chunk, start, end, duration, wait`` (seconds from the
    first op's start)."""
    grads: dict[str, Tensor]
    """Gradient of every trainable parameter, named as in ``nn.Sequential(*layers)``:
    ``"3.weight"`` (frozen parameters are left out)."""
    loss: float
    """The full batch's loss (the micro-batch losses, weighted by their share of rows)."""
    peak_bytes: list[int]
    """Per stage, the most bytes of saved activations held at once."""
    mb_bytes: list[dict[tuple[int, int], int]]
    """Per stage, bytes saved by each (micro-batch, chunk)'s forward."""
    grad_bytes: list[dict[tuple[int, int], int]] = field(default_factory=list)
    """Per stage, bytes of output gradients each (micro-batch, chunk) kept from its B to its W
    (empty dicts without W ops)."""
    layers: list[list[range]] = field(default_factory=list)
    """Per rank, per chunk, the layer indices it ran (`assign_layers`)."""

    @property
    def makespan(self) -> float:
        """Seconds from the first op's start to the last op's end."""
        return float(self.table["end"].max() - self.table["start"].min())

    @property
    def bubble(self) -> float:
        """Measured idle fraction, 1 − busy / (p · makespan)."""
        return idle_fraction(self.table, self.schedule.p)


def run_pipeline(layers: Sequence[nn.Module] | nn.Sequential, x: Tensor, y: Tensor, *,
                 schedule: str | Schedule = "1f1b", p: int | None = None, m: int | None = None,
                 v: int | None = None, loss_fn: LossFn | None = None,
                 timeout: float = 60.0) -> PipelineRun:
    """One training step's forward and backward of ``nn.Sequential(*layers)`` on (x, y), run as a
    pipeline on p gloo ranks (`toolkit.launch.spawn`) with the given schedule.

    `schedule` is a name (one of `toolkit.pipeline.NAMES`: ``"gpipe"``, ``"1f1b"``,
    ``"zb-h1"``, ``"chimera"``, …; then p is required, m defaults to 1, v to 1) or a `Schedule`
    (which fixes p, m and v; it is checked with `check_schedule` first, so a bad one raises
    `ScheduleError` instead of hanging).
    `loss_fn(out, y)` must average over samples (default: mean squared error).
    """
    if isinstance(layers, nn.Module) and not isinstance(layers, (nn.Sequential, nn.ModuleList)):
        raise ValueError(f"run_pipeline: layers must be a list of modules to cut into stages "
                         f"(e.g. model.layers), got a {type(layers).__name__}")
    layers = list(layers)
    if isinstance(schedule, Schedule):
        for arg, given, have in (("p", p, schedule.p), ("m", m, schedule.m), ("v", v, schedule.v)):
            if given is not None and given != have:
                raise ValueError(f"run_pipeline: {arg} = {given} disagrees with the schedule "
                                 f"passed ({arg} = {have}); leave {arg} out")
        sched = check_schedule(schedule)
    else:
        if p is None:
            raise ValueError("run_pipeline: pass p, the number of stages (ranks)")
        check_ints("run_pipeline", p=p, m=1 if m is None else m, v=1 if v is None else v)
        sched = make_schedule(schedule, p=p, m=m or 1, v=v or 1)
    ranges = assign_layers(len(layers), p=sched.p, v=sched.v, layout=sched.layout)
    if len(x) != len(y):
        raise ValueError(f"run_pipeline: x has {len(x)} samples but y has {len(y)}")
    if sched.m > len(x):
        raise ValueError(f"run_pipeline: m (micro-batches) = {sched.m} is more than the batch's "
                         f"{len(x)} samples; use m <= {len(x)}")
    results = spawn(run_stage, sched.p, layers, x, y, sched, loss_fn, timeout=timeout,
                    echo=False, backend="gloo")
    table = pd.DataFrame([row for res in results for row in res["rows"]],
                         columns=COLUMNS + ["wait"])
    t0 = table["start"].min()
    table[["start", "end"]] -= t0
    table = table.sort_values(["stage", "start"], kind="stable").reset_index(drop=True)
    grads = {name: g for res in results for name, g in res["grads"].items()}
    order = {name: i for i, (name, _) in enumerate(nn.Sequential(*layers).named_parameters())}
    grads = dict(sorted(grads.items(), key=lambda kv: order.get(kv[0], len(order))))
    return PipelineRun(schedule=sched, table=table, grads=grads,
                       loss=sum(res["loss"] for res in results),
                       peak_bytes=[res["peak_bytes"] for res in results],
                       mb_bytes=[res["mb_bytes"] for res in results],
                       grad_bytes=[res["grad_bytes"] for res in results], layers=ranges)


__all__ = ["PipelineRun", "run_pipeline"]
