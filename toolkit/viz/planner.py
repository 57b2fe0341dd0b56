"""Figures for planning N-D parallel runs (lesson 14): the rank grid of a layout, where a step's
time goes for the best layouts, memory against time for all of them, prediction against
measurement.

* `mesh_grid`: every rank as a cell, data-parallel replicas as rows, tensor-parallel groups as
  runs of adjacent cells (split by context-parallel blocks), pipeline stages as panels side by
  side; colour = node (or stage), so a group that crosses a node boundary shows.
* `time_bars`: stacked seconds per step (compute, TP, CP, PP sends, bubble, DP) of the first
  rows of a `toolkit.planner.plan` table (by default the fastest of each dp × tp × pp × cp
  shape), MFU written at the end of each bar.
* `memory_time`: every layout of the table as a point, memory per GPU against step time, the
  GPU's memory as a line: feasible layouts sit left of it.
* `predicted_measured`: grouped bars of predicted and measured seconds per layout.

Pure functions: data in, plotly figure out; no processes, no widgets.
"""

from __future__ import annotations

from typing import Mapping

import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative

__all__ = ["PARTS", "mesh_grid", "memory_time", "predicted_measured", "time_bars"]

PARTS = {"compute": "#1f77b4", "tp_comm": "#d62728", "cp_comm": "#9467bd",
         "pp_comm": "#8c564b", "bubble": "#bbbbbb", "dp_comm": "#ff7f0e"}
"""Time parts of a plan row, in stacking order, with their colours."""


def mesh_grid(layout, *, gpus_per_node: int | None = None, max_ranks: int = 256) -> go.Figure:
    """The rank grid of `layout` (a `toolkit.planner.Layout`): panel per pipeline stage, row per
    data-parallel index, cp blocks of tp cells per row; each cell shows its global rank.
    Coloured by node when `gpus_per_node` is given (ranks are numbered node by node), else by
    pipeline stage."""
    n = layout.world_size
    if n > max_ranks:
        raise ValueError(f"mesh_grid: {n} ranks is too many cells to draw (max_ranks="
                         f"{max_ranks}); draw a smaller layout with the same shape")
    colours = qualitative.Pastel + qualitative.Set3
    fig = go.Figure()
    width = layout.cp * layout.tp + (layout.cp - 1) * 0.3  # one panel, cp gaps included
    for r in range(n):
        c = layout.coords(r)
        x = c["pp"] * (width + 1.0) + c["cp"] * (layout.tp + 0.3) + c["tp"]
        y = layout.dp - 1 - c["dp"]  # replica 0 on top
        group = r // gpus_per_node if gpus_per_node else c["pp"]
        fig.add_shape(type="rect", x0=x, x1=x + 0.92, y0=y, y1=y + 0.92,
                      fillcolor=colours[group % len(colours)], line=dict(color="#444", width=1))
        fig.add_annotation(x=x + 0.46, y=y + 0.46, text=str(r), showarrow=False,
                           font_size=12 if n <= 64 else 8)
    for stage in range(layout.pp):
        fig.add_annotation(x=stage * (width + 1.0) + width / 2, y=layout.dp + 0.25,
                           text=f"stage {stage}" if layout.pp > 1 else "all layers",
                           showarrow=False, font_size=12)
    colour_note = (f"colour = node of {gpus_per_node}" if gpus_per_node
                   else "colour = pipeline stage")
    fig.update_xaxes(visible=False, range=[-0.3, layout.pp * (width + 1.0) - 0.7])
    fig.update_yaxes(visible=False, range=[-0.3, layout.dp + 0.6], scaleanchor="x")
    fig.update_layout(
        title=dict(text=f"{layout.label()}: rows = data-parallel replicas, adjacent cells = one "
                        f"tensor-parallel group ({layout.tp} ranks), {colour_note}",
                   font_size=13),
        height=max(220, 60 * layout.dp + 90), plot_bgcolor="white",
        margin=dict(l=10, r=10, t=50, b=10))
    return fig


SHAPE = ["dp", "tp", "pp", "cp"]


def _feasible(table: pd.DataFrame, top: int, distinct: bool) -> pd.DataFrame:
    if not {"config", "fits", "step", "mfu", *SHAPE, *PARTS} <= set(table.columns):
        raise ValueError("expected a toolkit.planner.plan table (columns config, fits, step, "
                         "mfu, dp, tp, pp, cp and the time parts)")
    rows = table[table.fits]
    if distinct:  # the table is sorted: the first row of a shape is its fastest
        rows = rows.drop_duplicates(subset=SHAPE, keep="first")
    return rows.head(top)


def time_bars(table: pd.DataFrame, *, top: int = 10, distinct: bool = True,
              title: str | None = None) -> go.Figure:
    """Stacked horizontal bars of the `top` fastest feasible rows of a (sorted) plan table:
    seconds per step by part (`PARTS`), best on top, with MFU at the end of each bar.
    `distinct`: only the fastest row of each dp × tp × pp × cp shape (ZeRO stages and
    micro-batch counts of one shape often tie)."""
    rows = _feasible(table, top, distinct)
    fig = go.Figure()
    labels = list(rows.config)
    for part, colour in PARTS.items():
        if (rows[part] > 0).any():
            fig.add_bar(y=labels, x=rows[part], name=part.replace("_comm", " comm"),
                        orientation="h", marker_color=colour)
    for label, step, mfu in zip(labels, rows.step, rows.mfu):
        fig.add_annotation(x=step, y=label, text=f" MFU {mfu:.0%}", showarrow=False,
                           xanchor="left", font_size=11)
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(title_text="predicted seconds per step")
    fig.update_layout(barmode="stack", height=max(260, 28 * len(rows) + 120),
                      title=title or f"the {len(rows)} fastest layouts that fit"
                      + (" (fastest of each dp × tp × pp × cp)" if distinct else ""),
                      legend=dict(orientation="h", y=-0.2), margin=dict(l=170, r=60, t=50, b=40))
    return fig


def memory_time(table: pd.DataFrame, *, memory_gib: float, title: str | None = None
                ) -> go.Figure:
    """Every row as a point: memory per GPU (GiB) against predicted step time; the GPU's
    memory as a dashed line. Hover shows the layout."""
    fig = go.Figure()
    for fits, colour, name in ((True, "#2ca02c", "fits"), (False, "#d62728", "does not fit")):
        part = table[table.fits == fits]
        fig.add_scatter(x=part.memory_GiB, y=part.step, mode="markers", name=name,
                        text=part.config, marker=dict(color=colour, size=6, opacity=0.7),
                        hovertemplate="%{text}<br>%{x:.1f} GiB, %{y:.3g} s<extra></extra>")
    fig.add_shape(type="line", x0=memory_gib, x1=memory_gib, yref="paper", y0=0, y1=1,
                  line=dict(dash="dash", color="#444"))
    fig.update_xaxes(type="log", title_text="memory per GPU (GiB)")
    fig.update_yaxes(type="log", title_text="predicted seconds per step")
    fig.update_layout(title=title or f"{len(table)} layouts: memory against time "
                                     f"(dashed: {memory_gib:.3g} GiB per GPU)",
                      height=400, margin=dict(l=60, r=20, t=50, b=40))
    return fig


def predicted_measured(rows: Mapping[str, Mapping[str, float]], *,
                       title: str = "seconds per step: predicted and measured") -> go.Figure:
    """Grouped bars: ``rows[layout] = {"predicted": s, "measured": s}``; the ratio measured /
    predicted written above each pair."""
    labels = list(rows)
    fig = go.Figure()
    for key, colour in (("predicted", "#1f77b4"), ("measured", "#ff7f0e")):
        fig.add_bar(x=labels, y=[rows[k][key] for k in labels], name=key, marker_color=colour)
    for k in labels:
        ratio = rows[k]["measured"] / rows[k]["predicted"]
        fig.add_annotation(x=k, y=max(rows[k].values()), text=f"×{ratio:.2f}", yanchor="bottom",
                           showarrow=False)
    fig.update_layout(barmode="group", title=title, yaxis_title="seconds", height=360,
                      margin=dict(l=60, r=20, t=50, b=40))
    return fig
