"""Figures of number formats and loss scaling (lesson 05): pure functions, data in, figure out.

- `format_ranges`: each format's representable magnitudes on a log2 axis, subnormal and normal
  parts apart, with marked values (a gradient of 1e-8, the fp16 maximum, ...);
- `survival_histogram`: a sample of gradient magnitudes times a loss scale, against one
  format's bands (flushed to zero / subnormal / normal / overflow);
- `scale_history`: a dynamic loss scale per step, skipped steps marked;
- `amax_history`: a tensor's amax per step against the range a delayed fp8 scale gives it (the
  largest value it can hold, and the magnitude below which values flush), overflows marked.

The format limits come from `toolkit.formats` (read from torch); nothing here runs a model.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import plotly.graph_objects as go
import torch
from plotly.colors import qualitative

from ..formats import Format, survival

BANDS = {"zero": "#d62728", "subnormal": "#ff7f0e", "normal": "#2ca02c", "overflow": "#9467bd"}
"""One colour per fate of a value in every precision figure of the course."""


def _edges(fmt: Format) -> dict[str, float]:
    """log2 of the band edges: below `zero` rounds to 0, then subnormal, normal, overflow."""
    return {"zero": math.log2(fmt.smallest_subnormal / 2),
            "subnormal": math.log2(fmt.smallest_normal), "max": math.log2(fmt.max)}


def format_ranges(formats: Sequence[Format], *, marks: Mapping[str, float] | None = None,
                  title: str = "what each format can hold (log2 of the magnitude)") -> go.Figure:
    """One row per format: its subnormal magnitudes (light) and normal ones (dark), from the
    smallest subnormal to the largest value, on a log2 axis; `marks` (label → value) drawn as
    dotted vertical lines."""
    if not formats:
        raise ValueError("format_ranges: no formats to draw")
    fig = go.Figure()
    names = [f.name for f in formats][::-1]  # first format on top
    for f in formats:
        lo, normal, hi = (math.log2(f.smallest_subnormal), math.log2(f.smallest_normal),
                          math.log2(f.max))
        for part, start, end, opacity in (("subnormal", lo, normal, 0.45),
                                          ("normal", normal, hi, 1.0)):
            fig.add_bar(y=[f.name], x=[end - start], base=[start], orientation="h",
                        marker_color=BANDS[part], opacity=opacity, showlegend=f is formats[0],
                        name=part, legendgroup=part,
                        hovertemplate=(f"{f.name} {part}: 2^{start:.1f} … 2^{end:.1f}"
                                       "<extra></extra>"))
        fig.add_annotation(x=hi, y=f.name, text=f" e{f.exponent_bits} m{f.mantissa_bits}",
                           showarrow=False, xanchor="left", font=dict(size=11))
    for i, (label, value) in enumerate((marks or {}).items()):
        x = math.log2(abs(value))
        fig.add_vline(x=x, line_dash="dot", line_color=qualitative.Dark2[i % 8])
        fig.add_annotation(x=x, y=1.02 + 0.06 * (i % 3), yref="paper", text=label,
                           showarrow=False, font=dict(size=11, color=qualitative.Dark2[i % 8]))
    fig.update_layout(title=title, barmode="overlay", height=120 + 45 * len(formats),
                      xaxis_title="log2 |x|", yaxis=dict(categoryorder="array",
                                                         categoryarray=names),
                      legend=dict(orientation="h", y=-0.35), margin=dict(t=90))
    return fig


def survival_histogram(magnitudes: torch.Tensor, fmt: Format, *, scale: float = 1.0,
                       title: str = "") -> go.Figure:
    """Histogram of log2(|g| · scale) for the nonzero values of `magnitudes` (bins of 1/4 in
    log2), over `fmt`'s bands; the legend gives each band's fraction of all values, zeros
    included (`toolkit.formats.survival`)."""
    every = magnitudes.detach().double().abs().reshape(-1) * scale
    a = every[every > 0]
    if a.numel() == 0:
        raise ValueError("survival_histogram: no nonzero magnitudes to draw")
    x = torch.log2(a)
    fractions = survival(every, fmt.name)
    edges = _edges(fmt)
    lo, hi = min(x.min().item(), edges["zero"]) - 2, max(x.max().item(), edges["max"]) + 2
    fig = go.Figure()
    spans = {"zero": (lo, edges["zero"]), "subnormal": (edges["zero"], edges["subnormal"]),
             "normal": (edges["subnormal"], edges["max"]), "overflow": (edges["max"], hi)}
    for band, (start, end) in spans.items():
        fig.add_vrect(x0=start, x1=end, fillcolor=BANDS[band], opacity=0.12, line_width=0)
        fig.add_scatter(x=[None], y=[None], mode="markers", marker=dict(color=BANDS[band],
                        size=10, symbol="square"), name=f"{band}: {fractions[band]:.2%}")
    # Binned here (0.25 in log2), so the figure carries counts, not every sample.
    width = 0.25
    lo_bin, hi_bin = math.floor(x.min().item() / width), math.ceil(x.max().item() / width) + 1
    counts = torch.histc(x, bins=hi_bin - lo_bin, min=lo_bin * width, max=hi_bin * width)
    centers = [(lo_bin + i + 0.5) * width for i in range(len(counts))]
    fig.add_bar(x=centers, y=counts.tolist(), width=width, marker_color="#444", name="values",
                showlegend=False, hovertemplate="2^%{x:.2f}: %{y}<extra></extra>")
    fig.update_layout(title=title or f"{fmt.name}, loss scale 2^{math.log2(scale):g}",
                      xaxis=dict(title="log2 (|gradient| × scale)", range=[lo, hi]),
                      yaxis_title="count", height=360, legend=dict(orientation="h", y=-0.25))
    return fig


def scale_history(scales: Mapping[str, Sequence[float]], *,
                  skipped: Mapping[str, Sequence[int]] | None = None,
                  title: str = "loss scale per step") -> go.Figure:
    """log2 of each run's loss scale per step (name → scale before each step); the steps in
    `skipped` (name → step indices) marked with a cross."""
    if not scales:
        raise ValueError("scale_history: no runs to draw")
    fig = go.Figure()
    for i, (name, values) in enumerate(scales.items()):
        color = qualitative.Plotly[i % 10]
        ys = [math.log2(v) for v in values]
        fig.add_scatter(x=list(range(len(ys))), y=ys, mode="lines", name=name,
                        line=dict(color=color, shape="hv", dash="dash" if i else "solid"))
        steps = list((skipped or {}).get(name, ()))
        if steps:
            fig.add_scatter(x=steps, y=[ys[s] for s in steps], mode="markers",
                            marker=dict(symbol="x", size=9, color=color),
                            name=f"{name}: skipped ({len(steps)})")
    fig.update_layout(title=title, xaxis_title="step", yaxis_title="log2 scale", height=340,
                      legend=dict(orientation="h", y=-0.25))
    return fig


def amax_history(amaxes: Sequence[float], scales: Sequence[float], fmt: Format, *,
                 title: str = "") -> go.Figure:
    """log2 of each step's amax beside the range step t's scale s_t gives the tensor in `fmt`:
    values up to max/s_t are kept (above: saturated), values at most half the smallest subnormal
    over s_t flush to 0. Steps whose amax exceeds max/s_t are marked as overflows."""
    if not amaxes or len(amaxes) != len(scales):
        raise ValueError(f"amax_history: need one scale per amax, got {len(amaxes)} amaxes and "
                         f"{len(scales)} scales")
    steps = list(range(len(amaxes)))
    top = [math.log2(fmt.max / s) for s in scales]
    floor = [math.log2(fmt.smallest_subnormal / 2 / s) for s in scales]
    amax = [math.log2(a) if a > 0 else float("nan") for a in amaxes]
    over = [t for t in steps if amaxes[t] * scales[t] > fmt.max]
    fig = go.Figure()
    fig.add_scatter(x=steps, y=top, mode="lines", name=f"largest {fmt.name} value / scale",
                    line=dict(color=BANDS["overflow"], shape="hv"))
    fig.add_scatter(x=steps, y=floor, mode="lines", name="flushed to 0 below",
                    line=dict(color=BANDS["zero"], shape="hv", dash="dot"))
    fig.add_scatter(x=steps, y=amax, mode="lines+markers", name="amax of the tensor",
                    line=dict(color="#444"), marker=dict(size=4))
    fig.add_scatter(x=over, y=[amax[t] for t in over], mode="markers",
                    name=f"overflow: top values saturate ({len(over)})",
                    marker=dict(symbol="x", size=10, color=BANDS["overflow"]))
    fig.update_layout(title=title or f"delayed scaling, {fmt.name}", xaxis_title="step",
                      yaxis_title="log2 magnitude", height=360,
                      legend=dict(orientation="h", y=-0.25))
    return fig


__all__ = ["BANDS", "amax_history", "format_ranges", "scale_history", "survival_histogram"]
