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
    fig = go.Figure()
    rows: list[str] = []

    def row_of_bars(row: str, bars: list[tuple], *, name: str, group: str, first: bool,
                    line: dict, opacity: float = 1.0, hover: str = "%{customdata}") -> None:
        # bars: (start s, end s, colour, hover data); one trace per row (plotly validates each)
        rows.append(row)
        fig.add_trace(go.Bar(
            orientation="h", base=[(b[0] - t0) * 1e3 for b in bars],
            x=[(b[1] - b[0]) * 1e3 for b in bars], y=[row] * len(bars),
            marker=dict(color=[b[2] for b in bars], opacity=opacity, line=line),
            name=name, legendgroup=group, showlegend=first, customdata=[b[3] for b in bars],
            hovertemplate=f"{row}: {hover}<br>%{{x:.3f}} ms<extra></extra>"))

    comm_hover = "%{customdata[0]}, %{customdata[1]} bytes"
    white = dict(color="white", width=1)
    for rank in ranks:
        first = rank == ranks[0]
        row_of_bars(f"rank {rank} compute",
                    [(s.start, s.end, _compute_color(s.name), s.name)
                     for s in compute if s.rank == rank],
                    name="compute (ATen ops; copies orange, matmuls dark)", group="compute",
                    first=first, line=dict(width=0))
        row_of_bars(f"rank {rank} comm (profiler)",
                    [(s.start, s.end, _comm_color(s.name.split(":", 1)[-1]),
                      [s.name, f"{s.nbytes:,}"]) for s in comm if s.rank == rank],
                    name="communication (profiler: the backend's work)", group="comm",
                    first=first, line=white, opacity=0.8, hover=comm_hover)
        if recorded:
            row_of_bars(f"rank {rank} comm (recorder)",
                        [(e.start, e.end if e.end is not None else e.start, _comm_color(e.op),
                          [e.op, f"{e.nbytes:,}"])
                         for e in sorted(recorded, key=lambda e: e.start) if e.rank == rank],
                        name="communication (recorder: call to wait)", group="recorded",
                        first=first, line=white, opacity=0.45, hover=comm_hover)
    fig.update_layout(title=title, barmode="overlay", height=140 + 45 * len(rows),
                      xaxis_title="time since the step's first event (ms)",
                      yaxis=dict(categoryorder="array", categoryarray=rows[::-1]),
                      legend=dict(orientation="h", y=-0.2), margin=dict(l=180, r=20, t=60, b=40))
    return fig
