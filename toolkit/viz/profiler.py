"""A profiled step of every rank on one plotly timeline: compute against communication, from
`torch.profiler`'s events (`toolkit.viz.trace`), with `toolkit.comm`'s recorded calls of the
same step beneath when given (lesson 06).

Per rank, up to three rows: **compute** (each outermost ATen operator, or GPU kernel, one bar:
copies orange, matrix products dark grey, the rest light grey), **comm (profiler)** (the
backend's collectives, e.g. ``gloo:all_reduce`` on gloo's worker threads, purple as in every
timeline of the course), and **comm (recorder)** (what lesson 04 records: a call from its start
in Python to the end of its wait). Time zero is the earliest event drawn. Pure: spans in,
figure out.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import plotly.graph_objects as go

from ..comm.events import Event
from .timeline import _COLORS
from .trace import COPY_OPS, Span

__all__ = ["profile_timeline"]

_COPY, _MATMUL, _OTHER = "#ff7f0e", "#7f7f7f", "#c7c7c7"
_MATMULS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear"})


def _compute_color(name: str) -> str:
    return _COPY if name in COPY_OPS else _MATMUL if name in _MATMULS else _OTHER


def _comm_color(op: str) -> str:
    return _COLORS.get(op, _COLORS["all_reduce"])


def profile_timeline(spans: Iterable[Span], *, recorded: Sequence[Event] = (),
                     title: str = "one step per rank: compute and communication") -> go.Figure:
    """Rows per rank (module docstring); hover gives each bar's operator, duration and, for a
    collective, its bytes. ``recorded``: `toolkit.comm` events of the same step (any ops)."""
    spans = list(spans)
    compute = [s for s in spans if s.kind == "compute" and s.depth == 0]
    comm = [s for s in spans if s.kind == "comm"]
    ranks = sorted({s.rank for s in compute + comm} | {e.rank for e in recorded})
    if not ranks:
        raise ValueError("profile_timeline: nothing to draw (no compute or comm spans, no "
                         "recorded events); pass toolkit.viz.trace.merge_traces(...) output")
    t0 = min([s.start for s in compute + comm] + [e.start for e in recorded])
    ms = 1e3
    fig = go.Figure()
    rows: list[str] = []
    for rank in ranks:
        mine = [s for s in compute if s.rank == rank]
        row = f"rank {rank} compute"
        rows.append(row)
        fig.add_trace(go.Bar(
            orientation="h", base=[(s.start - t0) * ms for s in mine],
            x=[s.duration * ms for s in mine], y=[row] * len(mine),
            marker=dict(color=[_compute_color(s.name) for s in mine], line_width=0),
            name="compute (ATen ops; copies orange, matmuls dark)", legendgroup="compute",
            showlegend=rank == ranks[0], customdata=[s.name for s in mine],
            hovertemplate=f"rank {rank}: %{{customdata}}<br>%{{x:.3f}} ms<extra></extra>"))
        mine = [s for s in comm if s.rank == rank]
        row = f"rank {rank} comm (profiler)"
        rows.append(row)
        fig.add_trace(go.Bar(
            orientation="h", base=[(s.start - t0) * ms for s in mine],
            x=[s.duration * ms for s in mine], y=[row] * len(mine),
            marker=dict(color=[_comm_color(s.name.split(":", 1)[-1]) for s in mine],
                        opacity=0.8, line=dict(color="white", width=1)),
            name="communication (profiler: the backend's work)", legendgroup="comm",
            showlegend=rank == ranks[0],
            customdata=[[s.name, f"{s.nbytes:,}"] for s in mine],
            hovertemplate=(f"rank {rank}: %{{customdata[0]}}, %{{customdata[1]}} bytes<br>"
                           "%{x:.3f} ms<extra></extra>")))
        if recorded:
            mine_r = sorted((e for e in recorded if e.rank == rank), key=lambda e: e.start)
            row = f"rank {rank} comm (recorder)"
            rows.append(row)
            ends = [e.end if e.end is not None else e.start for e in mine_r]
            fig.add_trace(go.Bar(
                orientation="h", base=[(e.start - t0) * ms for e in mine_r],
                x=[(end - e.start) * ms for e, end in zip(mine_r, ends)], y=[row] * len(mine_r),
                marker=dict(color=[_comm_color(e.op) for e in mine_r], opacity=0.45,
                            line=dict(color="white", width=1)),
                name="communication (recorder: call to wait)", legendgroup="recorded",
                showlegend=rank == ranks[0],
                customdata=[[e.op, f"{e.nbytes:,}"] for e in mine_r],
                hovertemplate=(f"rank {rank}: %{{customdata[0]}}, %{{customdata[1]}} bytes"
                               "<br>%{x:.3f} ms<extra></extra>")))
    fig.update_layout(title=title, barmode="overlay", height=140 + 45 * len(rows),
                      xaxis_title="time since the step's first event (ms)",
                      yaxis=dict(categoryorder="array", categoryarray=rows[::-1]),
                      legend=dict(orientation="h", y=-0.2), margin=dict(l=180, r=20, t=60, b=40))
    return fig
