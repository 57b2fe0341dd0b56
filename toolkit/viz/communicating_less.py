"""Figures of lesson 15 (communicating less): traffic over a run, loss against modelled time,
PowerSGD's error and bytes per rank r, final loss against learning rate per optimizer, and the
steps and examples a batch size costs against the critical batch.

Pure functions: recorded numbers in, plotly figure out (`toolkit.experiments.local_sgd`,
`powersgd`, `large_batch` and `noise_scale` produce the numbers; `toolkit.cost.traffic` and
`toolkit.cost.critical_batch` the formulas).
"""

from __future__ import annotations

import math
from itertools import accumulate
from typing import Mapping, Sequence

import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from ..cost.critical_batch import steps_and_examples

__all__ = ["batch_tradeoff", "cumulative_traffic", "loss_vs_time", "lr_sweep", "rank_tradeoff"]


def _color(i: int) -> str:
    return qualitative.Plotly[i % len(qualitative.Plotly)]


def cumulative_traffic(recorded: Mapping[str, Sequence[float]], *,
                       predicted: Mapping[str, Sequence[float]] | None = None,
                       title: str = "bytes passed to all-reduce, cumulative") -> go.Figure:
    """One solid line per run: the running total of the bytes recorded per step; a dotted line
    of the same colour for the formula's running total, where ``predicted`` has one."""
    if not recorded:
        raise ValueError("cumulative_traffic: recorded is empty")
    fig = go.Figure()
    for i, (name, per_step) in enumerate(recorded.items()):
        fig.add_trace(go.Scatter(x=list(range(1, len(per_step) + 1)),
                                 y=list(accumulate(per_step)), mode="lines", name=name,
                                 line=dict(color=_color(i), width=2, shape="hv")))
        if predicted and name in predicted:
            fig.add_trace(go.Scatter(x=list(range(1, len(predicted[name]) + 1)),
                                     y=list(accumulate(predicted[name])), mode="lines",
                                     name=f"{name}: formula", showlegend=False,
                                     line=dict(color=_color(i), width=5, dash="dot", shape="hv"),
                                     opacity=0.5))
    fig.update_layout(title=title, xaxis_title="step", yaxis_title="bytes (rank 0)", height=340,
                      legend=dict(orientation="h", y=-0.25))
    return fig


def loss_vs_time(curves: Mapping[str, Sequence[float]], seconds_per_step: Mapping[str, float],
                 *, title: str = "loss against modelled time", target: float | None = None
                 ) -> go.Figure:
    """Each run's loss per step drawn at step × its modelled seconds per step; ``target`` a
    dashed horizontal line (e.g. the loss DDP ends at)."""
    missing = [n for n in curves if n not in seconds_per_step]
    if missing:
        raise ValueError(f"loss_vs_time: no seconds_per_step for {missing}")
    fig = go.Figure()
    for i, (name, losses) in enumerate(curves.items()):
        dt = seconds_per_step[name]
        fig.add_trace(go.Scatter(x=[(k + 1) * dt for k in range(len(losses))], y=list(losses),
                                 mode="lines", name=name, line=dict(color=_color(i), width=2)))
    if target is not None:
        fig.add_hline(y=target, line=dict(dash="dash", color="#555", width=1))
    fig.update_layout(title=title, xaxis_title="modelled time (s)", yaxis_title="loss",
                      height=360, legend=dict(orientation="h", y=-0.25))
    fig.update_yaxes(type="log")
    return fig


def rank_tradeoff(ranks: Sequence[int], errors: Mapping[str, Sequence[float]],
                  sent_bytes: Sequence[float], *, dense_bytes: float, chosen: int | None = None,
                  title: str = "PowerSGD: error and bytes against rank r") -> go.Figure:
    """Left: relative error ‖M − M̂‖/‖M‖ per r, one line per method (e.g. one power step, the
    best rank-r from the SVD). Right: bytes sent per r against the dense matrix's."""
    if len(sent_bytes) != len(ranks) or any(len(v) != len(ranks) for v in errors.values()):
        raise ValueError("rank_tradeoff: every series needs one value per rank in `ranks`")
    fig = make_subplots(rows=1, cols=2, subplot_titles=("relative error", "bytes per step"))
    for i, (name, values) in enumerate(errors.items()):
        fig.add_trace(go.Scatter(x=list(ranks), y=list(values), mode="lines+markers", name=name,
                                 line=dict(color=_color(i))), row=1, col=1)
    fig.add_trace(go.Bar(x=list(ranks), y=list(sent_bytes), name="r·(n + m)·4 bytes",
                         marker_color="#636efa"), row=1, col=2)
    fig.add_hline(y=dense_bytes, line=dict(dash="dash", color="#ef553b"), row=1, col=2,
                  annotation_text="n·m·4 (uncompressed)")
    if chosen is not None:
        for col in (1, 2):
            fig.add_vline(x=chosen, line=dict(dash="dot", color="#555"), row=1, col=col)
    fig.update_xaxes(title_text="rank r")
    fig.update_layout(title=title, height=340, legend=dict(orientation="h", y=-0.3))
    return fig


def lr_sweep(final_losses: Mapping[str, Mapping[float, float]], *, initial: float,
             title: str = "final loss against learning rate") -> go.Figure:
    """One line per optimizer: final loss at each learning rate (log-log); a run that blew up
    (nan or inf) is drawn as an ✕ at ``initial``, the loss at initialisation (dashed)."""
    fig = go.Figure()
    for i, (name, by_lr) in enumerate(final_losses.items()):
        lrs = sorted(by_lr)
        ok = [lr for lr in lrs if math.isfinite(by_lr[lr])]
        bad = [lr for lr in lrs if lr not in ok]
        fig.add_trace(go.Scatter(x=ok, y=[by_lr[lr] for lr in ok], mode="lines+markers",
                                 name=name, line=dict(color=_color(i))))
        if bad:
            fig.add_trace(go.Scatter(x=bad, y=[initial] * len(bad), mode="markers",
                                     name=f"{name}: blew up", showlegend=False,
                                     marker=dict(symbol="x", size=12, color=_color(i))))
    fig.add_hline(y=initial, line=dict(dash="dash", color="#555", width=1),
                  annotation_text="loss at initialisation")
    fig.update_xaxes(type="log", title_text="learning rate")
    fig.update_yaxes(type="log", title_text="final training loss")
    fig.update_layout(title=title, height=360, legend=dict(orientation="h", y=-0.25))
    return fig


def batch_tradeoff(b_crit: Mapping[str, float], *, batches: Sequence[float] = (),
                   title: str = "steps and examples against batch size") -> go.Figure:
    """For each named critical batch B_crit: S/S_min = 1 + B_crit/B (solid) and
    E/E_min = 1 + B/B_crit (dotted) against B on log axes (McCandlish et al. 2018, §2.3);
    ``batches`` marked as dotted vertical lines (the batches a lesson ran)."""
    if not b_crit or any(not (math.isfinite(v) and v > 0) for v in b_crit.values()):
        raise ValueError(f"batch_tradeoff: b_crit must map names to numbers > 0, got {b_crit}")
    low = min(min(b_crit.values()) / 30, *(b / 3 for b in batches)) if batches else \
        min(b_crit.values()) / 30
    high = max(max(b_crit.values()) * 30, *(b * 3 for b in batches)) if batches else \
        max(b_crit.values()) * 30
    xs = [low * (high / low) ** (k / 80) for k in range(81)]
    fig = go.Figure()
    for i, (name, crit) in enumerate(b_crit.items()):
        ratios = [steps_and_examples(b, crit) for b in xs]
        fig.add_trace(go.Scatter(x=xs, y=[r[0] for r in ratios], mode="lines",
                                 name=f"{name}: steps S/S_min", line=dict(color=_color(i))))
        fig.add_trace(go.Scatter(x=xs, y=[r[1] for r in ratios], mode="lines",
                                 name=f"{name}: examples E/E_min",
                                 line=dict(color=_color(i), dash="dot")))
    for b in batches:
        fig.add_vline(x=b, line=dict(dash="dot", color="#555", width=1),
                      annotation_text=f"B = {b:g}")
    fig.update_xaxes(type="log", title_text="batch size B")
    fig.update_yaxes(type="log", title_text="multiple of the minimum")
    fig.update_layout(title=title, height=360, legend=dict(orientation="h", y=-0.25))
    return fig
