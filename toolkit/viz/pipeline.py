"""Gantt charts of pipeline schedules: one row per stage, one bar per forward or backward.

Takes a timeline table (`toolkit.pipeline.simulate(...).table` or `run_pipeline(...).table`:
columns ``stage, op, mb, chunk, start, end, duration``, seconds) and returns a plotly figure;
no processes, no state. Forwards are blue, backwards orange, weight gradients (W, a split
backward: Qi et al. 2024) green (a rank's later chunk a darker shade), each bar labelled with its
micro-batch (``3`` or ``3.1`` for chunk 1). Each row sits on a grey band spanning the whole step,
so idle time shows as grey; the row's label gives that stage's idle share and the title the
bubble (idle fraction) of the run. `gantt_memory` adds, under the chart, what every stage holds
at its peak (whole micro-batches, and those waiting for their W).
"""

from __future__ import annotations

from typing import Sequence

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

_F = ["#1f77b4", "#0b4f87", "#6baed6", "#08306b"]   # forward, by chunk
_B = ["#ff7f0e", "#b35806", "#fdae6b", "#7f2704"]   # backward, by chunk
_W = ["#2ca02c", "#1a6b1a", "#98df8a", "#0b3d0b"]   # weight gradient, by chunk
_COLORS = {"F": _F, "B": _B, "W": _W}
_WORDS = {"F": "forward", "B": "backward", "W": "weight grad (W)"}
_IDLE = "#e6e6e6"
_NEEDED = {"stage", "op", "mb", "chunk", "start", "end", "duration"}


def _check(table: pd.DataFrame, owner: str) -> None:
    missing = _NEEDED - set(table.columns)
    if missing:
        raise ValueError(f"{owner}: the timeline table lacks columns {sorted(missing)}; pass "
                         f"simulate(...).table or run_pipeline(...).table")


def _label(stage: int, idle: float) -> str:
    return f"stage {stage} · idle {idle:.0%}"


def _traces(table: pd.DataFrame, p: int, *, scale: float, legend: bool,
            legendgroup: str = "", chunks: dict[int, str] | None = None
            ) -> tuple[list[go.Bar], float]:
    t0 = float(table["start"].min())
    span = float(table["end"].max()) - t0
    busy = table.groupby("stage")["duration"].sum()
    labels = [_label(r, 1 - float(busy.get(r, 0.0)) / span if span > 0 else 0.0)
              for r in range(p)]
    traces = [go.Bar(y=labels, x=[span * scale] * p, base=[0.0] * p, orientation="h",
                     marker_color=_IDLE, width=0.8, name="idle", hoverinfo="skip",
                     showlegend=legend, legendgroup=legendgroup + "idle")]
    split = (table["op"] == "W").any()
    for (kind, chunk), part in table.groupby(["op", "chunk"], sort=True):
        colors = _COLORS.get(kind, _B)
        chunk_tag = [f".{c}" if c else "" for c in part["chunk"]]
        text = [f"{mb}{c}" for mb, c in zip(part["mb"], chunk_tag)]
        word = "input grad (B)" if kind == "B" and split else _WORDS.get(kind, kind)
        if chunks:
            name = f"{word}, {chunks.get(int(chunk), f'chunk {chunk}')}"
        else:
            name = word + (f", chunk {chunk}" if chunk else "")
        wait = (part["wait"] * scale).round(3).tolist() if "wait" in part else [None] * len(part)
        traces.append(go.Bar(
            y=[labels[int(s)] for s in part["stage"]], x=(part["duration"] * scale).tolist(),
            base=((part["start"] - t0) * scale).tolist(), orientation="h", width=0.8,
            marker=dict(color=colors[int(chunk) % len(colors)], line=dict(color="white",
                                                                          width=0.5)),
            text=text, textposition="inside", insidetextanchor="middle", name=name,
            showlegend=legend, legendgroup=legendgroup + name,
            customdata=list(zip(text, ((part["end"] - t0) * scale).round(3), wait)),
            hovertemplate=(f"{kind}%{{customdata[0]}}<br>start %{{base:.3f}}, end "
                           f"%{{customdata[1]}}<br>duration %{{x:.3f}}"
                           + ("<br>waited for input %{customdata[2]}" if "wait" in part else "")
                           + "<extra></extra>")))
    return traces, span


def _unit(span: float) -> tuple[float, str]:
    return (1e3, "ms") if span < 10 else (1.0, "s")


def gantt(table: pd.DataFrame, *, title: str | None = None, p: int | None = None,
          seconds: bool = True, chunks: dict[int, str] | None = None) -> go.Figure:
    """A Gantt chart of one timeline: stage 0 on top, time on x (ms when `seconds` and the run
    is shorter than 10 s; pass ``seconds=False`` for a simulation in abstract time units).

    The title reports the bubble, 1 − busy / (p · makespan); `p` defaults to the stages seen.
    `chunks` names chunks in the legend (Chimera: ``{0: "down", 1: "up"}``).
    """
    _check(table, "gantt")
    p = p if p is not None else int(table["stage"].max()) + 1
    span = float(table["end"].max() - table["start"].min())
    scale, unit = _unit(span) if seconds else (1.0, "time units")
    traces, span = _traces(table, p, scale=scale, legend=True, chunks=chunks)
    bubble = 1 - float(table["duration"].sum()) / (p * span) if span > 0 else 0.0
    fig = go.Figure(traces)
    fig.update_layout(
        title=(title or "Pipeline timeline") + f" — bubble {bubble:.1%}", barmode="overlay",
        height=120 + 45 * p, xaxis_title=unit, legend_orientation="h", legend_y=-0.25,
        margin=dict(l=10, r=10, t=50, b=10))
    fig.update_yaxes(autorange="reversed")
    return fig


def gantt_compare(measured: pd.DataFrame, ideal: pd.DataFrame, *, title: str | None = None,
                  p: int | None = None,
                  names: tuple[str, str] = ("measured", "ideal (simulated)"),
                  chunks: dict[int, str] | None = None) -> go.Figure:
    """Two Gantt charts on one time axis, `measured` above `ideal` (both timeline tables in
    seconds), each panel titled with its bubble."""
    _check(measured, "gantt_compare")
    _check(ideal, "gantt_compare")
    p = p if p is not None else int(max(measured["stage"].max(), ideal["stage"].max())) + 1
    span = max(float(t["end"].max() - t["start"].min()) for t in (measured, ideal))
    scale, unit = _unit(span)
    panels = []
    for table in (measured, ideal):
        s = float(table["end"].max() - table["start"].min())
        panels.append(1 - float(table["duration"].sum()) / (p * s) if s > 0 else 0.0)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12,
                        subplot_titles=[f"{n} — bubble {b:.1%}" for n, b in zip(names, panels)])
    for row, table in enumerate((measured, ideal), start=1):
        traces, _ = _traces(table, p, scale=scale, legend=row == 1, chunks=chunks)
        for trace in traces:
            fig.add_trace(trace, row=row, col=1)
        fig.update_yaxes(autorange="reversed", row=row, col=1)
    fig.update_layout(title=title or "Measured vs ideal", barmode="overlay",
                      height=200 + 90 * p, legend_orientation="h", legend_y=-0.12,
                      margin=dict(l=10, r=10, t=70, b=10))
    fig.update_xaxes(title_text=unit, row=2, col=1)
    return fig


def gantt_memory(table: pd.DataFrame, held: Sequence[tuple[float, float]], *,
                 title: str | None = None, p: int | None = None, seconds: bool = False,
                 chunks: dict[int, str] | None = None) -> go.Figure:
    """A Gantt chart (top) over what each stage holds at its peak (bottom): `held[r]` is
    (micro-batches between F and B, micro-batches between B and W) at stage r's peak, in
    units of one micro-batch's activations through a whole stage."""
    _check(table, "gantt_memory")
    p = p if p is not None else int(table["stage"].max()) + 1
    if len(held) != p:
        raise ValueError(f"gantt_memory: held needs one (whole, awaiting W) pair per stage "
                         f"({p}), got {len(held)}")
    span = float(table["end"].max() - table["start"].min())
    scale, unit = _unit(span) if seconds else (1.0, "time units")
    bubble = 1 - float(table["duration"].sum()) / (p * span) if span > 0 else 0.0
    fig = make_subplots(rows=2, cols=1, row_heights=[0.68, 0.32], vertical_spacing=0.16,
                        subplot_titles=["timeline", "activations held at the peak, per stage "
                                                    "(micro-batches)"])
    traces, _ = _traces(table, p, scale=scale, legend=True, chunks=chunks)
    for trace in traces:
        fig.add_trace(trace, row=1, col=1)
    stages = [f"stage {r}" for r in range(p)]
    fig.add_trace(go.Bar(x=stages, y=[h[0] for h in held], name="held: F done, B not",
                         marker_color="#4c72b0"), row=2, col=1)
    if any(h[1] for h in held):
        fig.add_trace(go.Bar(x=stages, y=[h[1] for h in held], name="held: B done, W not",
                             marker_color=_W[2]), row=2, col=1)
    fig.update_yaxes(autorange="reversed", row=1, col=1)
    fig.update_xaxes(title_text=unit, row=1, col=1)
    fig.update_layout(title=(title or "Pipeline schedule") + f" — bubble {bubble:.1%}",
                      barmode="overlay", height=260 + 60 * p, legend_orientation="h",
                      legend_y=-0.15, margin=dict(l=10, r=10, t=70, b=10))
    fig.update_traces(selector=dict(name="held: B done, W not"), base=[h[0] for h in held])
    return fig


__all__ = ["gantt", "gantt_compare", "gantt_memory"]
