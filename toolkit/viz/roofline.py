"""Roofline figures (Williams, Waterman & Patterson, CACM 2009; the model is `toolkit.roofline`):
machines as roofs, kernels as points, and the best MFU a TinyGPT block allows per micro-batch.

* `roofline_figure(roofs, points)`: log-log attainable FLOP/s against arithmetic intensity, one
  roof per machine with its ridge point marked, measured kernels as points with their spread.
* `roofline_view(layer=..., micro_batch=..., ...)`: one layer of `TinyGPT` at a micro-batch
  size, placed on this machine's roof and on the datasheet GPUs' (lesson 06's explorer).
* `mfu_bound_figure(cfg, micro_batches, roofs)`: `toolkit.roofline.mfu_bound` of one block's
  forward kernels per micro-batch and machine, measured MFU beside it.

Pure functions: numbers in, plotly figure (and a sentence of HTML) out.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import plotly.graph_objects as go

from ..arguments import check_int
from ..models import GPTConfig
from ..roofline import (
    DATASHEET_ROOFS, Kernel, Roof, attention, gpt_block_kernels, layernorm, linear, mfu_bound,
    tokens_to_ridge,
)

__all__ = ["LAYERS", "layer_kernel", "mfu_bound_figure", "roofline_figure", "roofline_view"]

_ROOF_COLORS = ("#1f77b4", "#2ca02c", "#d62728", "#9467bd", "#8c564b")
_POINT_COLORS = {"up_proj": "#ff7f0e", "down_proj": "#e377c2", "q_proj": "#bcbd22",
                 "attention": "#17becf", "attention (fused)": "#9edae5", "ln_1": "#7f7f7f"}
LAYERS = tuple(_POINT_COLORS)
"""The TinyGPT layers `layer_kernel` knows (forward)."""


def layer_kernel(layer: str, cfg: GPTConfig, micro_batch: int, *, seq_len: int | None = None,
                 bytes_per_element: int = 4) -> Kernel:
    """The `toolkit.roofline` kernel of one TinyGPT layer (`LAYERS`) at a micro-batch size."""
    check_int("layer_kernel", "micro_batch", micro_batch)
    s = cfg.seq_len if seq_len is None else check_int("layer_kernel", "seq_len", seq_len)
    t, h, e = micro_batch * s, cfg.d_model, bytes_per_element
    make = {"up_proj": lambda: linear(t, h, cfg.ff_dim, bytes_per_element=e, name=layer),
            "down_proj": lambda: linear(t, cfg.ff_dim, h, bytes_per_element=e, name=layer),
            "q_proj": lambda: linear(t, h, h, bytes_per_element=e, name=layer),
            "attention": lambda: attention(micro_batch, s, h, cfg.n_head, bytes_per_element=e),
            "attention (fused)": lambda: attention(micro_batch, s, h, cfg.n_head, fused=True,
                                                   bytes_per_element=e, name=layer),
            "ln_1": lambda: layernorm(t, h, bytes_per_element=e, name=layer)}
    if layer not in make:
        raise ValueError(f"layer_kernel: layer must be one of {list(LAYERS)}, got {layer!r}")
    return make[layer]()


def _grid(lo: float, hi: float, n: int = 60) -> list[float]:
    a, b = math.log10(lo), math.log10(hi)
    return [10 ** (a + (b - a) * i / (n - 1)) for i in range(n)]


def roofline_figure(roofs: Sequence[Roof], points: Sequence[Mapping] = (), *,
                    title: str = "roofline", intensity_range: tuple[float, float] = (0.1, 1e3)
                    ) -> go.Figure:
    """Roofs as lines (ridge points marked) and ``points`` as markers. A point is a mapping
    with ``label`` (written beside it; hover only when ``show_label`` is False), ``intensity``
    (FLOP/B) and ``flops`` (FLOP/s), optionally ``lo`` / ``hi`` (its spread, FLOP/s),
    ``group`` (legend entry and colour), ``symbol`` and ``show_label``."""
    if not roofs:
        raise ValueError("roofline_figure: pass at least one Roof")
    lo, hi = intensity_range
    xs = sorted(set(_grid(lo, hi)) | {r.ridge for r in roofs if lo < r.ridge < hi})
    fig = go.Figure()
    for i, roof in enumerate(roofs):
        color = _ROOF_COLORS[i % len(_ROOF_COLORS)]
        fig.add_trace(go.Scatter(x=xs, y=[roof.attainable(x) for x in xs], mode="lines",
                                 line=dict(color=color, width=2), name=roof.name,
                                 legendgroup=roof.name,
                                 hovertemplate=f"{roof.name}<br>I = %{{x:.3g}} FLOP/B: "
                                               "%{y:.3s}FLOP/s<extra></extra>"))
        fig.add_trace(go.Scatter(x=[roof.ridge], y=[roof.peak_flops], mode="markers",
                                 marker=dict(color=color, size=9, symbol="diamond"),
                                 legendgroup=roof.name, showlegend=False,
                                 hovertemplate=f"{roof.name}: ridge at %{{x:.3g}} FLOP/B, "
                                               "peak %{y:.3s}FLOP/s<extra></extra>"))
    groups: dict[str, list[Mapping]] = {}
    for p in points:
        groups.setdefault(str(p.get("group", p["label"])), []).append(p)
    for g, pts in groups.items():
        lo_err = [p["flops"] - p.get("lo", p["flops"]) for p in pts]
        hi_err = [p.get("hi", p["flops"]) - p["flops"] for p in pts]
        fig.add_trace(go.Scatter(
            x=[p["intensity"] for p in pts], y=[p["flops"] for p in pts], mode="markers+text",
            text=[str(p["label"]) if p.get("show_label", True) else "" for p in pts],
            hovertext=[str(p["label"]) for p in pts], textposition="top center",
            marker=dict(color=_POINT_COLORS.get(g, "#333333"), size=10,
                        symbol=[p.get("symbol", "circle") for p in pts],
                        line=dict(color="black", width=1)),
            error_y=dict(type="data", array=hi_err, arrayminus=lo_err, visible=True),
            name=g, hovertemplate=f"{g} %{{hovertext}}<br>I = %{{x:.3g}} FLOP/B<br>"
                                  "%{y:.3s}FLOP/s<extra></extra>"))
    fig.update_layout(title=title, height=460, legend=dict(orientation="h", y=-0.2),
                      xaxis=dict(type="log", title="arithmetic intensity (FLOP per byte)"),
                      yaxis=dict(type="log", title="FLOP/s", exponentformat="SI"),
                      margin=dict(t=60, b=40))
    return fig


def roofline_view(*, layer: str, micro_batch: int, seq_len: int, bytes_per_element: int,
                  cfg: GPTConfig, here: Roof,
                  others: Sequence[Roof] = tuple(DATASHEET_ROOFS.values())
                  ) -> tuple[go.Figure, str]:
    """One layer at a micro-batch size on `here` and on `others`: the figure, and a sentence
    per machine (memory- or compute-bound, the attainable FLOP/s and its share of the peak;
    for a linear layer, the micro-batch where it reaches the ridge)."""
    k = layer_kernel(layer, cfg, micro_batch, seq_len=seq_len, bytes_per_element=bytes_per_element)
    roofs = [here, *others]
    points = [{"label": r.name, "intensity": k.intensity, "flops": r.attainable(k.intensity),
               "group": layer, "symbol": "x", "show_label": False} for r in roofs]
    fig = roofline_figure(roofs, points, title=f"{layer}, micro-batch {micro_batch}, s = "
                          f"{seq_len}, {bytes_per_element} bytes per element: "
                          f"{k.intensity:.3g} FLOP/B")
    lines = []
    for r in roofs:
        got = r.attainable(k.intensity)
        bound = "compute-bound" if k.intensity >= r.ridge else "memory-bound"
        rate = f"{got / 1e12:.3g} TFLOP/s" if got >= 1e12 else f"{got / 1e9:.3g} GFLOP/s"
        line = (f"<b>{r.name}</b> (ridge {r.ridge:.3g} FLOP/B): {bound}, at most {rate} = "
                f"{got / r.peak_flops:.0%} of its peak")
        if layer in ("up_proj", "down_proj", "q_proj"):
            kk, m = (cfg.d_model, cfg.ff_dim) if layer == "up_proj" else (
                (cfg.ff_dim, cfg.d_model) if layer == "down_proj" else (cfg.d_model, cfg.d_model))
            t = tokens_to_ridge(kk, m, r, bytes_per_element=bytes_per_element)
            line += ("; never compute-bound at this width and precision" if t is None else
                     f"; compute-bound from micro-batch {math.ceil(t / seq_len)}")
        lines.append(line)
    return fig, "<br>".join(lines)


def mfu_bound_figure(cfg: GPTConfig, micro_batches: Sequence[int], roofs: Sequence[Roof], *,
                     bytes_per_element: int | Mapping[str, int] = 4,
                     measured: Mapping[str, Mapping[int, float]] | None = None,
                     title: str = "the best MFU the roofline allows one block") -> go.Figure:
    """`mfu_bound` of `gpt_block_kernels(cfg, b)` per micro-batch b and roof (lines), with
    ``measured`` MFU series (name → {micro-batch: MFU}) as markers. ``bytes_per_element``: one
    for all roofs, or per roof name (the precision its peak is quoted for; default 4)."""
    fig = go.Figure()
    for i, roof in enumerate(roofs):
        e = (bytes_per_element.get(roof.name, 4) if isinstance(bytes_per_element, Mapping)
             else bytes_per_element)
        ys = [mfu_bound(gpt_block_kernels(cfg, b, bytes_per_element=e), roof)
              for b in micro_batches]
        fig.add_trace(go.Scatter(x=list(micro_batches), y=ys, mode="lines+markers",
                                 line=dict(color=_ROOF_COLORS[i % len(_ROOF_COLORS)]),
                                 name=f"bound: {roof.name} ({8 * e}-bit)"))
    for j, (name, series) in enumerate((measured or {}).items()):
        fig.add_trace(go.Scatter(x=list(series), y=list(series.values()), mode="markers",
                                 marker=dict(size=11, symbol=("star", "circle-open")[j % 2],
                                             color="black"), name=name))
    fig.update_layout(title=title, height=400, legend=dict(orientation="h", y=-0.25),
                      xaxis=dict(type="log", title=f"micro-batch (sequences of {cfg.seq_len})"),
                      yaxis=dict(title="MFU", range=[0, 1.05], tickformat=".0%"))
    return fig
