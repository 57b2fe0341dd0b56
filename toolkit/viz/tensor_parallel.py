"""Figures for tensor parallelism (lesson 12): how a matmul splits, what each layer sends, and
when the link, not the arithmetic, sets the pace.

* `matmul_split`: Y = X·A drawn as blocks, A split by columns or by rows over p ranks, every
  block labelled with its shape (Shoeybi et al., 2019, "Megatron-LM", section 3).
* `layer_traffic` / `traffic_bars`: bytes one rank sends per transformer layer and step, tensor
  parallel (2 all-reduces of b·s·h forward, 2 backward) against data parallel (one all-reduce of
  the layer's gradients), by the ring's 2(p−1)/p rule.
* `tp_time_view`: the α-β model (`toolkit.cost`) of those all-reduces against the layer's compute
  (`toolkit.flops`' 72·b·s·h²·(1 + s/6h) per layer), as the link's bandwidth varies, with a
  sentence of verdict: the pure function behind lesson 12's explorer.

Pure functions: numbers in, plotly figure (and text) out; no processes, no widgets.
"""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go
from plotly.colors import qualitative

from .. import cost
from ..cost import AlphaBeta, human_bytes
from ..formats import byte_unit

__all__ = ["LINKS", "layer_traffic", "matmul_split", "tp_layer_time", "tp_time_view",
           "traffic_bars"]

LINKS: dict[str, AlphaBeta] = {
    # Bandwidth per direction; α is an order of magnitude only (NCCL's small-message latency).
    "NVLink 4 (H100 SXM, 450 GB/s)": AlphaBeta(alpha=5e-6, beta=1 / 450e9),
    "InfiniBand NDR (400 Gb/s = 50 GB/s)": AlphaBeta(alpha=10e-6, beta=1 / 50e9),
    "Ethernet (100 Gb/s = 12.5 GB/s)": AlphaBeta(alpha=30e-6, beta=1 / 12.5e9),
}
"""Typical links: NVIDIA H100 datasheet (NVLink 900 GB/s both directions), InfiniBand NDR and
100 GbE line rates; α values are assumed, of the order NCCL shows for small messages."""

_RANK = qualitative.Plotly  # rank i's colour in every block drawing
_GREY = "#d9d9d9"


def _box(fig: go.Figure, x0: float, y0: float, w: float, h: float, color: str, text: str) -> None:
    fig.add_shape(type="rect", x0=x0, y0=y0, x1=x0 + w, y1=y0 + h, fillcolor=color,
                  line=dict(color="#333", width=1), opacity=0.85)
    fig.add_annotation(x=x0 + w / 2, y=y0 + h / 2, text=text, showarrow=False, font_size=11)


def matmul_split(kind: str, p: int = 2, *, rows: str = "b·s", inner: str = "h",
                 outer: str = "4h") -> go.Figure:
    """Y = X·A with A split over `p` ranks by ``"column"`` or by ``"row"``; colour = rank.

    Column split: A = [A_1 … A_p] (inner × outer/p each); X is whole on every rank and rank i
    computes Y_i = X·A_i, its outer/p columns of Y. Row split: A = [A_1; …; A_p] (inner/p × outer
    each) and X = [X_1 … X_p]; rank i computes the full-size partial product X_i·A_i, and
    Y = Σ_i X_i·A_i needs an all-reduce.
    """
    if kind not in ("column", "row"):
        raise ValueError(f"kind must be 'column' or 'row', got {kind!r}")
    if not isinstance(p, int) or not 1 <= p <= len(_RANK):
        raise ValueError(f"p must be an int from 1 to {len(_RANK)}, got {p!r}")
    fig = go.Figure()
    hx, wx, wa = 3.0, 2.0, 3.0  # heights/widths of X (rows × inner) and A (inner × outer)
    gap = 0.9
    ax0, yx0 = wx + gap, 0.0
    if kind == "column":
        _box(fig, 0, yx0, wx, hx, _GREY, f"X<br>({rows}, {inner})<br>every rank")
        for i in range(p):
            _box(fig, ax0 + i * wa / p, yx0 + hx - wx, wa / p, wx, _RANK[i],
                 f"A{i + 1}<br>({inner}, {outer}/{p})")
        y0 = ax0 + wa + gap
        for i in range(p):
            _box(fig, y0 + i * wa / p, yx0, wa / p, hx, _RANK[i],
                 f"Y{i + 1}<br>({rows}, {outer}/{p})")
        title = ("column split: Y_i = X·A_i on rank i, nothing to send forward "
                 "(backward: dX = Σ_i dY_i·A_iᵀ, an all-reduce)")
    else:
        for i in range(p):
            _box(fig, i * wx / p, yx0, wx / p, hx, _RANK[i], f"X{i + 1}<br>({rows}, {inner}/{p})")
            _box(fig, ax0, yx0 + hx - (i + 1) * wx / p, wa, wx / p, _RANK[i],
                 f"A{i + 1}: ({inner}/{p}, {outer})")
        y0 = ax0 + wa + gap
        _box(fig, y0, yx0, wa, hx, _GREY, f"Y = Σ_i X_i·A_i<br>({rows}, {outer})<br>all-reduce")
        title = "row split: rank i computes X_i·A_i (full size), Y is their sum: an all-reduce"
    for x, sym in ((wx + gap / 2, "·"), (ax0 + wa + gap / 2, "=")):
        fig.add_annotation(x=x, y=hx / 2, text=f"<b>{sym}</b>", showarrow=False, font_size=22)
    fig.update_xaxes(visible=False, range=[-0.2, y0 + wa + 0.2])
    fig.update_yaxes(visible=False, range=[-0.2, hx + 0.2], scaleanchor="x")
    fig.update_layout(title=dict(text=title, font_size=13), height=300, plot_bgcolor="white",
                      margin=dict(l=10, r=10, t=50, b=10))
    return fig


def layer_traffic(*, batch: int, seq: int, hidden: int, p: int,
                  bytes_per_elem: int = 2) -> dict[str, float]:
    """Bytes one rank sends per transformer layer per step, ring all-reduces over p ranks.

    ``tp_forward`` / ``tp_backward``: 2 all-reduces each of b·s·h elements (Megatron-LM);
    ``dp``: one all-reduce of the layer's 12·h² weight gradients (q, k, v, out: 4h²; MLP with
    d_ff = 4h: 8h²; biases and LayerNorms left out). A ring sends 2(p−1)/p of what it reduces.
    """
    ring = 2 * (p - 1) / p
    act = batch * seq * hidden * bytes_per_elem
    return {"tp_forward": 2 * act * ring, "tp_backward": 2 * act * ring,
            "dp": 12 * hidden ** 2 * bytes_per_elem * ring}


def traffic_bars(rows: dict[str, dict[str, float]], *, title: str = "bytes sent per rank, "
                 "per layer and step") -> go.Figure:
    """Grouped bars: ``rows[label][part] = bytes`` (e.g. {"recorded": …, "formula": …}), drawn
    in the IEC unit of the largest bar (`toolkit.formats.byte_unit`), each bar labelled in the
    same unit as the axis."""
    top = max((abs(v) for parts in rows.values() for v in parts.values()), default=0)
    unit, scale = byte_unit(top)
    fig = go.Figure()
    for label, parts in rows.items():
        fig.add_bar(name=label, x=list(parts), y=[v / scale for v in parts.values()],
                    text=[f"{v / scale:.4g} {unit}" for v in parts.values()],
                    textposition="outside")
    fig.update_layout(barmode="group", title=title, yaxis_title=unit, height=380,
                      yaxis_rangemode="tozero", margin=dict(l=60, r=20, t=60, b=40))
    return fig


def tp_layer_time(*, hidden: int, tp: int, tokens: int, seq: int, link: AlphaBeta,
                  peak_flops: float, efficiency: float = 0.5,
                  bytes_per_elem: int = 2) -> dict[str, float]:
    """Seconds per layer and step: ``compute`` (72·tokens·h²·(1 + s/6h) FLOPs / tp at
    `efficiency` × peak; Narayanan et al., 2021, per layer) and ``comm`` (4 ring
    all-reduces of tokens·h elements over tp ranks, α-β model)."""
    if tp < 1 or hidden < 1 or tokens < 1 or seq < 1:
        raise ValueError(f"need hidden, tp, tokens, seq >= 1, got {hidden}, {tp}, {tokens}, {seq}")
    flops = 72 * tokens * hidden ** 2 * (1 + seq / (6 * hidden))
    compute = flops / tp / (efficiency * peak_flops)
    n = tokens * hidden * bytes_per_elem
    comm = 4 * float(cost.predict("all_reduce", "ring", n, tp, link)) if tp > 1 else 0.0
    return {"compute": compute, "comm": comm, "allreduce_bytes": n}


def tp_time_view(*, hidden: int, tp: int, tokens: int, bandwidth_gbs: float, seq: int = 2048,
                 alpha_us: float = 10.0, peak_flops: float = 989e12, efficiency: float = 0.5
                 ) -> tuple[go.Figure, str]:
    """The explorer's view: per-layer compute and TP communication time vs link bandwidth.

    Lines over bandwidths from 1 to 1000 GB/s; a marker at `bandwidth_gbs`; the named `LINKS`
    as dotted lines. Returns (figure, HTML verdict at the chosen bandwidth).
    """
    if not bandwidth_gbs > 0 or alpha_us < 0:
        raise ValueError(f"need bandwidth > 0 GB/s and α >= 0 µs, got {bandwidth_gbs}, {alpha_us}")
    bws = np.logspace(0, 3, 61)
    kw = dict(hidden=hidden, tp=tp, tokens=tokens, seq=seq, peak_flops=peak_flops,
              efficiency=efficiency)
    rows = [tp_layer_time(link=AlphaBeta(alpha_us * 1e-6, 1 / (bw * 1e9)), **kw) for bw in bws]
    ms = 1e3
    fig = go.Figure()
    fig.add_scatter(x=bws, y=[r["comm"] * ms for r in rows], name="TP all-reduces (4 per layer)",
                    line=dict(color="#d62728"))
    fig.add_scatter(x=bws, y=[r["compute"] * ms for r in rows], name="compute per rank",
                    line=dict(color="#1f77b4"))
    here = tp_layer_time(link=AlphaBeta(alpha_us * 1e-6, 1 / (bandwidth_gbs * 1e9)), **kw)
    fig.add_scatter(x=[bandwidth_gbs], y=[here["comm"] * ms], mode="markers", name="your link",
                    marker=dict(size=12, color="#d62728", symbol="diamond"))
    for name, link in LINKS.items():
        gbs = link.bandwidth / 1e9
        fig.add_shape(type="line", x0=gbs, x1=gbs, yref="paper", y0=0, y1=1,
                      line=dict(dash="dot", color="#888"))
        # On a log axis plotly places annotations in log10 units (shapes in data units).
        fig.add_annotation(x=math.log10(gbs), yref="paper", y=1, yanchor="top", xanchor="right",
                           text=name.split(" (")[0], textangle=-90, showarrow=False)
    fig.update_xaxes(type="log", range=[0, 3], title_text="link bandwidth (GB/s, per direction)")
    fig.update_yaxes(type="log", dtick=1, tickformat=",~r", title_text="ms per layer per step")
    fig.update_layout(title=f"h = {hidden:,}, tp = {tp}, {tokens:,} tokens (s = {seq:,}): "
                            f"all-reduces vs compute", height=420,
                      legend=dict(orientation="h", y=-0.25), margin=dict(l=60, r=20, t=60, b=40))
    if tp == 1:
        verdict = "tp = 1: nothing to send; every rank holds the whole layer."
    else:
        share = here["comm"] / (here["comm"] + here["compute"])
        verdict = (f"at {bandwidth_gbs:.3g} GB/s: 4 all-reduces of "
                   f"{human_bytes(here['allreduce_bytes'])} take <b>{here['comm'] * ms:.3g} ms</b>"
                   f" against <b>{here['compute'] * ms:.3g} ms</b> of compute per layer: "
                   f"communication is <b>{share:.0%}</b> of the step if nothing overlaps.")
    return fig, verdict
