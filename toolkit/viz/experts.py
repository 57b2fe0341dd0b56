"""Figures for mixture-of-experts layers (lesson 13): where the router sent the tokens, what the
capacity cut, and what capacity and imbalance cost in dropped tokens, padding and bytes.

* `expert_loads`: choices per expert, kept and dropped, against the capacity C.
* `capacity_curves` / `capacity_view`: for a router whose busiest expert gets `imbalance` × the
  mean load (`toolkit.cost.experts.skewed_loads`), as the capacity factor cf varies: the share
  of choices dropped, the share of a padded buffer that is padding, and the all-to-all bytes the
  busiest rank sends per MoE layer and step with padded buffers (E·C rows, whatever the router
  does) and with ragged ones (the kept rows only). The formulas: `toolkit.cost.experts`
  (capacity: Switch Transformers §2.2, eq. 3; bytes: derived there).
* `violation_curves`: a router's imbalance step by step (Wang et al. 2024's MaxVio, max load /
  mean − 1), e.g. without and with the auxiliary-loss-free bias (`expert_parallel.balance`).

Pure functions: numbers in, plotly figure (and text) out.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..cost import human_bytes
from ..cost.experts import (
    dropped, expert_capacity, padding_rows, rows_per_expert, skewed_loads, step_bytes,
)

__all__ = ["FACTORS", "capacity_curves", "capacity_view", "expert_loads", "violation_curves"]

FACTORS = tuple(float(f) for f in np.round(np.arange(0.5, 4.01, 0.05), 2))
"""Capacity factors on the explorer's x axis."""


def expert_loads(load: Sequence[int], kept: Sequence[int], capacity: int, *,
                 title: str = "") -> go.Figure:
    """Stacked bars per expert: kept choices and dropped ones, the capacity C dashed."""
    if len(load) != len(kept) or any(k > n for n, k in zip(load, kept)):
        raise ValueError(f"expert_loads: kept must be one count <= load per expert, got load "
                         f"{list(load)} and kept {list(kept)}")
    experts = [f"expert {e}" for e in range(len(load))]
    fig = go.Figure()
    fig.add_bar(x=experts, y=list(kept), name="kept", marker_color="#1f77b4")
    fig.add_bar(x=experts, y=[n - k for n, k in zip(load, kept)], name="dropped",
                marker_color="#d62728")
    fig.add_hline(y=capacity, line_dash="dash", line_color="#333",
                  annotation_text=f"capacity C = {capacity}", annotation_position="top left")
    mean = sum(load) / len(load)
    fig.update_layout(barmode="stack", height=330, yaxis_title="choices (tokens)",
                      title=title or f"{sum(load)} choices, imbalance max/mean = "
                                     f"{max(load) / mean:.2f}, dropped {sum(load) - sum(kept)}",
                      margin=dict(l=60, r=20, t=60, b=40))
    return fig


def capacity_curves(*, num_experts: int, top_k: int, tokens: int, imbalance: float,
                    hidden: int, ep: int, elem_bytes: int = 2,
                    factors: Sequence[float] = FACTORS) -> dict[str, list[float]]:
    """Per capacity factor: ``dropped`` (share of the k·T choices), ``padding`` (share of the
    E·C slots), ``padded_bytes`` and ``ragged_bytes`` (bytes the busiest of ep ranks sends per
    MoE layer and step, counts included), every rank routing T tokens with the same skew."""
    loads = skewed_loads(tokens, num_experts, top_k=top_k, imbalance=imbalance)
    ints = [int(round(v)) for v in loads]
    out: dict[str, list[float]] = {"factor": list(factors), "capacity": [], "dropped": [],
                                   "padding": [], "padded_bytes": [], "ragged_bytes": []}
    for cf in factors:
        c = expert_capacity(tokens, num_experts, top_k=top_k, capacity_factor=cf)
        out["capacity"].append(c)
        out["dropped"].append(dropped(loads, c) / (top_k * tokens))
        out["padding"].append(padding_rows(loads, c) / (num_experts * c) if c else 0.0)
        for pad, key in ((True, "padded_bytes"), (False, "ragged_bytes")):
            rows = rows_per_expert([ints] * ep, [c] * ep, pad=pad)
            out[key].append(max(r["step_wire"] for r in step_bytes(rows, hidden=hidden,
                                                                     elem_bytes=elem_bytes)))
    return out


def capacity_view(*, capacity_factor: float, imbalance: float, num_experts: int = 8,
                  top_k: int = 2, tokens: int = 4096, hidden: int = 4096, ep: int = 8,
                  elem_bytes: int = 2) -> tuple[go.Figure, str]:
    """The explorer's view: dropped and padding shares (left) and the busiest rank's all-to-all
    bytes (right) against the capacity factor, a marker at `capacity_factor`; with a sentence
    of verdict. `tokens` per rank, Mixtral-like defaults (E = 8, k = 2, h = 4096, bf16)."""
    if ep > num_experts or num_experts % ep:
        raise ValueError(f"capacity_view: ep={ep} must divide num_experts={num_experts}")
    kw = dict(num_experts=num_experts, top_k=top_k, tokens=tokens, imbalance=imbalance,
              hidden=hidden, ep=ep, elem_bytes=elem_bytes)
    curves = capacity_curves(**kw)
    here = {k: v[0] for k, v in capacity_curves(**kw, factors=[capacity_factor]).items()}
    fig = make_subplots(rows=1, cols=2, subplot_titles=(
        "dropped choices and padding slots", "busiest rank's all-to-all bytes per layer, step"))
    x = curves["factor"]
    for key, name, color in (("dropped", "dropped (share of k·T choices)", "#d62728"),
                             ("padding", "padding (share of E·C slots)", "#7f7f7f")):
        fig.add_scatter(x=x, y=[100 * v for v in curves[key]], name=name, row=1, col=1,
                        line=dict(color=color))
        fig.add_scatter(x=[capacity_factor], y=[100 * here[key]], mode="markers", row=1, col=1,
                        marker=dict(size=11, color=color, symbol="diamond"), showlegend=False)
    for key, name, color in (("padded_bytes", "padded buffers (E·C rows)", "#9467bd"),
                             ("ragged_bytes", "kept rows only", "#1f77b4")):
        fig.add_scatter(x=x, y=[v / 2**20 for v in curves[key]], name=name, row=1, col=2,
                        line=dict(color=color))
        fig.add_scatter(x=[capacity_factor], y=[here[key] / 2**20], mode="markers", row=1,
                        col=2, marker=dict(size=11, color=color, symbol="diamond"),
                        showlegend=False)
    fig.update_xaxes(title_text="capacity factor cf")
    fig.update_yaxes(title_text="%", row=1, col=1, rangemode="tozero")
    fig.update_yaxes(title_text="MiB per rank", row=1, col=2, rangemode="tozero")
    fig.update_layout(height=420, legend=dict(orientation="h", y=-0.25),
                      title=f"E = {num_experts}, k = {top_k}, {tokens:,} tokens per rank, "
                            f"ep = {ep}, busiest expert {imbalance:.2g} × the mean load",
                      margin=dict(l=60, r=20, t=80, b=40))
    verdict = (f"cf = {capacity_factor:.2f}: C = {here['capacity']:,} slots per expert; "
               f"<b>{here['dropped']:.1%}</b> of the choices are dropped and "
               f"<b>{here['padding']:.1%}</b> of the padded slots carry no token; the busiest "
               f"rank sends <b>{human_bytes(here['padded_bytes'])}</b> per layer and step with "
               f"padded buffers, <b>{human_bytes(here['ragged_bytes'])}</b> sending kept rows "
               f"only.")
    return fig, verdict


def violation_curves(series: dict[str, Sequence[float]], *, title: str = "") -> go.Figure:
    """One line per series of MaxVio values (one per step, from step 1), y from 0."""
    if not series or any(len(v) == 0 for v in series.values()):
        raise ValueError("violation_curves: need at least one non-empty series of values")
    fig = go.Figure()
    for name, values in series.items():
        fig.add_scatter(x=list(range(1, len(values) + 1)), y=list(values), name=name,
                        mode="lines")
    fig.update_layout(height=340, title=title, xaxis_title="step",
                      yaxis_title="MaxVio = max load / mean load − 1",
                      yaxis_rangemode="tozero", margin=dict(l=60, r=20, t=60, b=40),
                      legend=dict(orientation="h", y=-0.25))
    return fig
