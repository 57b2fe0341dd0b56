"""Figures of offloading: the memory hierarchy's bandwidths (published and measured), bytes per
tier with each tier's capacity (`tier_bars`), an offloaded step on a timeline per thread, real
or modelled (`offload_timeline`), and the explorer's view of a whole offloaded iteration
(`offload_view`: memory per tier and where the time goes).

The numbers come from `toolkit.memory.offload` (ZeRO-Offload, ZeRO-Infinity), `toolkit.cost
.offload` and `toolkit.experiments.offload`; these functions only draw them. Pure functions:
data in, plotly figure out.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..cost.offload import Span, iteration_time
from ..memory import GB, GiB
from ..memory.offload import PARTS, PLACEMENTS, TIERS, TierBytes, offload_bytes
from .memory import COLORS as STATE_COLORS

COLORS = {**STATE_COLORS, "working": "#8c564b"}
"""Colour per part: the memory figures' colours, plus the GPU's working memory."""
KIND_COLORS = {"read": "#17becf", "update": "#2ca02c", "write": "#e377c2", "wait": "#d9d9d9"}
"""Colour per kind of work in an offloaded step."""


def bandwidth_bars(rows: Sequence[tuple[str, float, str]], *, title: str = "") -> go.Figure:
    """Horizontal bars of bandwidth (bytes/s) on a log axis, one per (label, bytes/s, group);
    a colour per group (e.g. "published", "measured here")."""
    if not rows:
        raise ValueError("bandwidth_bars: no rows to draw")
    fig = go.Figure()
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd"]
    for i, group in enumerate(dict.fromkeys(g for _, _, g in rows)):
        mine = [(label, bw) for label, bw, g in rows if g == group]
        fig.add_bar(y=[label for label, _ in mine], x=[bw / 1e9 for _, bw in mine],
                    orientation="h", name=group, marker_color=palette[i % len(palette)],
                    text=[f"{bw / 1e9:.3g} GB/s" for _, bw in mine], textposition="outside",
                    hovertemplate="%{y}: %{x:.3g} GB/s<extra></extra>")
    fig.update_layout(title=title or "bandwidth of each tier", height=120 + 26 * len(rows),
                      xaxis=dict(type="log", title="GB/s (log)"), barmode="group",
                      yaxis=dict(autorange="reversed"), legend=dict(orientation="h", y=-0.2),
                      margin=dict(l=10, r=40, t=50, b=40))
    return fig


def tier_bars(bars: Mapping[str, TierBytes], *, capacity: Mapping[str, float] | None = None,
              title: str = "") -> go.Figure:
    """For each label (a placement), one stacked bar per tier (GPU, CPU, NVMe) of its parts, in
    GB; a black dash marks each tier's `capacity` (bytes) when given."""
    if not bars:
        raise ValueError("tier_bars: no bars to draw")
    labels = list(bars)
    x = [[label for label in labels for _ in TIERS], [t for _ in labels for t in TIERS]]
    fig = go.Figure()
    for part in PARTS:
        ys = [bars[label].parts.get(t, {}).get(part, 0.0) / GB for label in labels for t in TIERS]
        if any(ys):
            fig.add_bar(x=x, y=ys, name=part, marker_color=COLORS[part],
                        hovertemplate=f"%{{x}}<br>{part}: %{{y:.4g}} GB<extra></extra>")
    totals = [bars[label].tier(t) / GB for label in labels for t in TIERS]
    fig.add_scatter(x=x, y=totals, mode="text", showlegend=False, hoverinfo="skip",
                    text=[f"{v:.3g}" if v else "" for v in totals], textposition="top center")
    if capacity:
        caps = [capacity.get(t, 0.0) / GB for _ in labels for t in TIERS]
        fig.add_scatter(x=x, y=caps, mode="markers", name="capacity",
                        marker=dict(symbol="line-ew-open", size=28, color="black",
                                    line=dict(width=3)),
                        hovertemplate="capacity %{y:.4g} GB<extra></extra>")
    fig.update_layout(barmode="stack", title=title or "bytes per rank in each tier", height=420,
                      yaxis=dict(title="GB per rank (log)", type="log"),
                      legend=dict(orientation="h", y=-0.25), margin=dict(t=60, b=40))
    return fig


def offload_timeline(runs: Mapping[str, Sequence[Span]], *, title: str = "") -> go.Figure:
    """One row per (run, lane), one bar per span (read, update, write, wait), in ms from each
    run's first span; runs are labelled by their keys (e.g. "measured", "model")."""
    if not runs or not any(runs.values()):
        raise ValueError("offload_timeline: no spans to draw")
    fig = go.Figure()
    rows: list[str] = []
    shown: set[str] = set()
    for label, spans in runs.items():
        if not spans:
            continue
        t0 = min(s.start for s in spans)
        for lane in ("main", "io"):
            mine = [s for s in spans if s.lane == lane]
            if not mine:
                continue
            row = f"{label}: {'update thread' if lane == 'main' else 'I/O thread'}"
            rows.append(row)
            for kind in KIND_COLORS:
                these = [s for s in mine if s.kind == kind]
                if not these:
                    continue
                fig.add_bar(y=[row] * len(these), x=[1e3 * (s.end - s.start) for s in these],
                            base=[1e3 * (s.start - t0) for s in these], orientation="h",
                            name=kind, legendgroup=kind, showlegend=kind not in shown,
                            marker_color=KIND_COLORS[kind], marker_line_width=0.5,
                            text=[str(s.chunk) for s in these], textposition="inside",
                            customdata=[s.chunk for s in these],
                            hovertemplate=(f"{kind} chunk %{{customdata}}: %{{base:.2f}} + "
                                           "%{x:.2f} ms<extra></extra>"))
                shown.add(kind)
    fig.update_layout(barmode="overlay", title=title or "an offloaded step, chunk by chunk",
                      height=140 + 45 * len(rows), xaxis_title="ms from the step's start",
                      yaxis=dict(categoryorder="array", categoryarray=rows[::-1]),
                      legend=dict(orientation="h", y=-0.25), margin=dict(t=60, b=40))
    return fig


def offload_view(*, placement: str, psi_b: float, tokens: float = 2048, n_d: int = 1,
                 peak_tflops: float = 100.0, pcie_gbs: float = 31.5, host_gbs: float = 50.0,
                 nvme_gbs: float = 3.5, gpu_gib: float = 80.0, cpu_gib: float = 256.0,
                 nvme_tb: float = 4.0, overlap: bool = True) -> tuple[go.Figure, str]:
    """The explorer's view: Ψ = `psi_b` billion parameters placed by `placement` (a name in
    `PLACEMENTS`, mixed-precision Adam) on `n_d` ranks; left the bytes per rank in each tier
    against the capacities per GPU, right the seconds per iteration on each resource
    (`toolkit.cost.offload.iteration_time`) and the step time, serial or overlapped."""
    if placement not in PLACEMENTS:
        raise ValueError(f"offload_view: placement must be one of {list(PLACEMENTS)}, "
                         f"got {placement!r}")
    where = PLACEMENTS[placement]
    psi = psi_b * 1e9
    tiers = offload_bytes(psi, where, n_d=n_d)
    capacity = {"gpu": gpu_gib * GiB, "cpu": cpu_gib * GiB, "nvme": nvme_tb * 1e12}
    times = iteration_time(psi, tokens=tokens, n_d=n_d, params_tier=where.params,
                           optimizer_tier=where.optimizer, peak_flops=peak_tflops * 1e12,
                           pcie=pcie_gbs * 1e9, host=host_gbs * 1e9, nvme=nvme_gbs * 1e9)
    fig = make_subplots(rows=1, cols=2, column_widths=[0.5, 0.5], horizontal_spacing=0.12,
                        subplot_titles=("GB per rank in each tier", "seconds per iteration"))
    for part in PARTS:
        ys = [tiers.parts[t].get(part, 0.0) / GB for t in TIERS]
        if any(ys):
            fig.add_bar(x=list(TIERS), y=ys, name=part, marker_color=COLORS[part], row=1, col=1)
    fig.add_scatter(x=list(TIERS), y=[capacity[t] / GB for t in TIERS], mode="markers",
                    name="capacity", marker=dict(symbol="line-ew-open", size=34, color="black",
                                                 line=dict(width=3)), row=1, col=1)
    parts = {"compute (GPU)": times.compute, "PCIe": times.pcie, "update (host memory)":
             times.host, "NVMe": times.nvme}
    step = times.overlapped if overlap else times.serial
    fig.add_bar(x=list(parts), y=list(parts.values()), marker_color="#7f7f7f", showlegend=False,
                text=[f"{v:.3g} s" for v in parts.values()], textposition="outside", row=1, col=2)
    fig.add_hline(y=step, line_dash="dash", line_color="#d62728", row=1, col=2,
                  annotation_text=f"step {step:.3g} s ({'overlapped' if overlap else 'serial'})")
    fig.update_layout(barmode="stack", height=440, title=f"{placement}: Ψ = {psi_b:.3g}B, "
                      f"N_d = {n_d}, {tokens:,.0f} tokens per GPU",
                      legend=dict(orientation="h", y=-0.2), margin=dict(t=70, b=40))
    fig.update_yaxes(type="log", row=1, col=1)
    fits = tiers.fits(capacity)
    full = [t for t in TIERS if tiers.tier(t) > capacity[t]]
    verdict = ("<b style='color:#2ca02c'>fits</b>" if fits else
               f"<b style='color:#d62728'>does not fit</b> ({', '.join(full)} too small)")
    bound = max(parts, key=parts.get)
    verdict += (f"; step {step:.3g} s, {times.compute / step:.0%} of it computing "
                f"(efficiency), bound by {bound}.")
    return fig, verdict


__all__ = ["COLORS", "KIND_COLORS", "bandwidth_bars", "offload_timeline", "offload_view",
           "tier_bars"]
