"""Figures for data parallelism: a computational graph with its values, and training curves.

`computation_graph` draws a small autograd graph (lesson 01's linear model) as boxes in
columns, leaves on the left, the loss on the right, each box showing a node's value and, once
backward has run, its gradient. `training_curves` draws loss (or any per-step quantity) for
several ways of training side by side. Pure functions: data in, plotly figure out.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import plotly.graph_objects as go
from plotly.colors import qualitative

__all__ = ["computation_graph", "training_curves"]

_KIND_COLORS = {"input": "#e8e8e8", "parameter": "#cfe3f7", "op": "#fff2cc", "loss": "#f8d0d0"}


def _fmt(v: float | None) -> str:
    return "–" if v is None or v != v else f"{v:.6g}"  # v != v: NaN (no gradient)


def _layout(nodes: Sequence[Mapping]) -> dict[str, tuple[float, float]]:
    """(column, -row) of every node: columns by depth, rows by barycentre of neighbours."""
    inputs = {n["name"]: list(n.get("inputs", ())) for n in nodes}
    consumers: dict[str, list[str]] = {k: [] for k in inputs}
    for k, ins in inputs.items():
        for i in ins:
            consumers[i].append(k)
    depth: dict[str, int] = {}

    def dep(k: str) -> int:
        if k not in depth:
            depth[k] = 0 if not inputs[k] else 1 + max(dep(i) for i in inputs[k])
        return depth[k]

    col = {k: dep(k) for k in inputs}
    for k in inputs:  # leaves move right, next to their first consumer
        if not inputs[k] and consumers[k]:
            col[k] = min(col[c] for c in consumers[k]) - 1
    order = {k: float(i) for i, k in enumerate(inputs)}
    key = dict(order)
    n_cols = max(col.values()) + 1

    def mean(values: list[float], default: float) -> float:
        return sum(values) / len(values) if values else default

    for sweep in range(2):
        for c in range(1, n_cols):
            here = [k for k in inputs if col[k] == c]
            for k in here:
                if inputs[k]:
                    key[k] = mean([key[i] for i in inputs[k]], order[k])
            for k in here:
                if not inputs[k]:
                    siblings = [key[i] for con in consumers[k] for i in inputs[con]
                                if i != k and inputs[i]]
                    key[k] = mean(siblings, order[k]) + 1e-3
        if sweep == 0:  # pull the first column's leaves towards their consumers
            for k in inputs:
                if col[k] == 0 and consumers[k]:
                    key[k] = mean([key[c] for c in consumers[k]], order[k]) + 1e-6 * order[k]
    rows = {c: sorted((k for k in inputs if col[k] == c), key=lambda k: key[k])
            for c in range(n_cols)}
    height = max(len(r) for r in rows.values())
    return {k: (float(c), -(j + (height - len(r)) / 2)) for c, r in rows.items()
            for j, k in enumerate(r)}


def computation_graph(nodes: Sequence[Mapping], *, title: str = "computational graph",
                      show_grad: bool = True) -> go.Figure:
    """Draw ``nodes`` as a left-to-right graph.

    Each node is a mapping with ``name`` (unique), ``inputs`` (names of the nodes it is computed
    from; empty for leaves), ``value`` (a float) and optionally ``op`` (a short label such as
    ``"×"``), ``grad`` (∂loss/∂node, a float or None) and ``kind`` (``"input"``,
    ``"parameter"``, ``"op"`` or ``"loss"``: the box colour). A node's column is one more than
    its deepest input's; a leaf sits just left of its first consumer (so a target y sits beside
    the error it enters, not with the inputs). Rows follow the mean row of a node's inputs
    (a barycentre sweep), which keeps arrows short and mostly uncrossed.
    """
    by_name = {n["name"]: n for n in nodes}
    if len(by_name) != len(nodes):
        raise ValueError("computation_graph: node names must be unique")
    for n in nodes:
        missing = [i for i in n.get("inputs", ()) if i not in by_name]
        if missing:
            raise ValueError(f"computation_graph: node {n['name']!r} has unknown inputs {missing}")
    pos = _layout(nodes)
    height = 1 + max(-y for _, y in pos.values())
    column = {k: int(x) for k, (x, _) in pos.items()}

    # Annotations collected as plain dicts and set once: add_annotation validates every call,
    # which costs seconds for a graph of a few dozen boxes and arrows.
    notes = []
    for n in nodes:
        x1, y1 = pos[n["name"]]
        for i in n.get("inputs", ()):
            x0, y0 = pos[i]
            notes.append(dict(x=x1 - 0.28, y=y1, ax=x0 + 0.28, ay=y0, xref="x", yref="y",
                              axref="x", ayref="y", showarrow=True, arrowhead=2,
                              arrowwidth=1.2, arrowcolor="#888", text=""))
    for n in nodes:
        x, y = pos[n["name"]]
        op = f" = {n['op']}" if n.get("op") else ""
        text = f"<b>{n['name']}</b>{op}<br>value {_fmt(n['value'])}"
        if show_grad:
            text += f"<br>grad {_fmt(n.get('grad'))}"
        color = _KIND_COLORS.get(n.get("kind", "op"), _KIND_COLORS["op"])
        notes.append(dict(x=x, y=y, text=text, showarrow=False, align="center", bgcolor=color,
                          bordercolor="#555", borderwidth=1, borderpad=4, font=dict(size=11)))
    fig = go.Figure(layout=dict(annotations=notes))
    n_cols = max(column.values()) + 1
    fig.update_layout(title=title, height=max(260, 95 * height + 80),
                      width=max(500, 165 * n_cols), margin=dict(l=10, r=10, t=50, b=10),
                      plot_bgcolor="white", showlegend=False)
    fig.update_xaxes(visible=False, range=[-0.6, n_cols - 0.4])
    fig.update_yaxes(visible=False, range=[-height + 0.4, 0.6])
    return fig


def training_curves(curves: Mapping[str, Sequence[float]], *, title: str = "training",
                    x_title: str = "optimizer step", y_title: str = "loss",
                    log_y: bool = True, dashed: Sequence[str] = ()) -> go.Figure:
    """One line per entry of ``curves`` (name → values per step); names in ``dashed`` dashed.

    Lines that coincide (accumulation and the big batch) stay visible because dashed lines are
    drawn on top of solid ones. Every finite value is drawn as it is (nothing is capped); a
    curve that reaches inf or NaN (a diverged run) ends there, and a note on the figure names
    the curve and the step, so a reader never mistakes the end of a line for convergence.
    """
    if not curves:
        raise ValueError("training_curves: curves is empty")
    fig = go.Figure()
    order = [k for k in curves if k not in dashed] + [k for k in curves if k in dashed]
    notes = []
    for name in order:
        values = [float(v) for v in curves[name]]
        blown = next((i for i, v in enumerate(values) if not math.isfinite(v)), None)
        if blown is not None:
            notes.append(f"{name}: {values[blown]:g} at {x_title} {blown}, not drawn from there")
            values = values[:blown]
        fig.add_trace(go.Scatter(
            x=list(range(len(values))), y=values, mode="lines", name=name,
            line=dict(dash="dash" if name in dashed else "solid",
                      width=2.5 if name in dashed else 2,
                      color=qualitative.Plotly[list(curves).index(name) % 10])))
    fig.update_layout(title=title, xaxis_title=x_title, yaxis_title=y_title, height=360,
                      legend=dict(orientation="h", y=-0.2))
    if notes:
        fig.add_annotation(text="<br>".join(notes), showarrow=False, xref="paper", yref="paper",
                           x=0.01, y=0.99, xanchor="left", yanchor="top", align="left",
                           font_size=11, bgcolor="rgba(255,255,255,0.8)")
    if log_y:   # powers of ten: "1B" on a loss axis would read as a size
        fig.update_yaxes(type="log", exponentformat="power")
    return fig
