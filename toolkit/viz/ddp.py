"""Figures and pure models for data-parallel training (lesson 04): overlap, scaling, staleness.

* `overlap_timeline`: one recorded DDP backward per rank, drawn as two rows per rank: the
  backward computation (one bar per layer, from the moments its gradients became ready) above
  the all-reduce of every bucket (from `toolkit.comm`'s recorder). Where a purple bar sits
  under a grey one, communication is hidden behind computation.
* `dp_step_time` / `scaling_table` / `scaling_figure`: the α-β model of one data-parallel step
  with a fixed global batch B (strong scaling): per-rank compute shrinks as B/P, the ring
  all-reduce of the gradients does not (2(P−1)α + 2(P−1)/P·n·β; Patarasuk & Yuan, JPDC 2009),
  so the efficiency T(1)/(P·T(P)) falls, and P cannot exceed B (a rank needs one item).
* `stale_sgd`: SGD on a quadratic where each update uses the gradient at the weights of k steps
  ago, the staleness of asynchronous (ASP) training with a parameter server (Dean et al.,
  "Large Scale Distributed Deep Networks", NeurIPS 2012; Ho et al., "More Effective Distributed
  ML via a Stale Synchronous Parallel Parameter Server", NeurIPS 2013); k = 0 is bulk-synchronous
  (BSP) data parallelism.

Pure functions: numbers or a recorded trace in, numbers or a plotly figure out.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping, Sequence

import plotly.graph_objects as go

from ..arguments import check_int, check_ints, check_positive, check_positives
from ..comm.events import Event
from ..cost import AlphaBeta, predict
from ..formats import human_bytes
from .timeline import greedy_lanes

__all__ = ["EFFICIENCY_TICKS", "dp_step_time", "overlap_timeline", "scaling_figure",
           "scaling_table", "stale_sgd"]

EFFICIENCY_TICKS = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
"""Where `scaling_figure` ticks its efficiency axis."""
_COMPUTE = ("#c7c7c7", "#a5a5a5")  # alternating greys: neighbouring layers stay distinct
_ALL_REDUCE = "#9467bd"             # the recorder timeline's all_reduce colour (viz.timeline)
# A bar's label is drawn inside it only if the bar spans at least this fraction of the time axis
# per character, plus a margin: with plotly's default plot width (~600-900 px) a character of the
# 11 px label font takes ~7 px, about 1 % of the axis.
_LABEL_PER_CHAR, _LABEL_MARGIN = 0.012, 0.01
_LABEL_FONT = 11   # px; plotly hides (never shrinks) a label that does not fit at this size
_BAR, _RANK_GAP, _ROW_PX = 0.8, 0.5, 34   # bar thickness and gap between ranks (rows); px per row


def _labelled(labels: Sequence[str], widths: Sequence[float], span: float) -> list[str]:
    """`labels` where the bar is wide enough to hold its label (widths and span in one unit),
    "" elsewhere: the hover text keeps every label."""
    return [text if width >= span * (_LABEL_PER_CHAR * len(text) + _LABEL_MARGIN) else ""
            for text, width in zip(labels, widths)]


def overlap_timeline(trace: Iterable[Event], compute: Mapping[int, Sequence[tuple]], *,
                     title: str = "backward and all-reduce per bucket") -> go.Figure:
    """Per rank, backward compute (one row) above the bucket all-reduces (one row per lane), ms.

    ``compute[rank]`` is a list of ``(label, start, end)`` in seconds since the epoch (the
    recorder's clock, ``time.time()``): e.g. one span per layer, from the previous gradient
    ready to this layer's. Every ``all_reduce`` of ``trace`` becomes a bar for bucket i (its
    order on that rank) from its start to the return of its ``wait()`` (an asynchronous
    all-reduce is in flight until backward waits for it at its end), with its bytes on hover.
    All-reduces of one rank that are in flight together get lanes of their own
    (`timeline.greedy_lanes`), so no bar hides another. A bar is labelled "b<i>" only where it is
    wide enough for the label (`_labelled`); narrower ones carry it on hover, and a note on the
    figure says how many, so no label is squeezed, overlaps another or vanishes unannounced, at
    any bucket count. Time zero is the earliest compute start.
    """
    events = [e for e in trace if e.op == "all_reduce"]
    ranks = sorted(set(compute) | {e.rank for e in events})
    if not ranks:
        raise ValueError("overlap_timeline: nothing to draw (no compute spans, no all-reduces)")
    starts = [s for spans in compute.values() for _, s, _ in spans] + [e.start for e in events]
    stops = ([e for spans in compute.values() for _, _, e in spans]
             + [e.end if e.end is not None else e.start for e in events])
    t0 = min(starts)
    ms = 1e3
    span_ms = max(max(stops + starts) - t0, 1e-9) * ms
    hidden = 0                           # bucket bars too narrow for their label
    ticks: list[tuple[float, str]] = []  # (y, row name), y growing downwards
    y = 0.0
    fig = go.Figure()
    for rank in ranks:   # two bar traces per rank (not one per bar: plotly validates each trace)
        spans = list(compute.get(rank, ()))
        ticks.append((y, f"rank {rank} backward"))
        fig.add_trace(go.Bar(
            orientation="h", base=[(s - t0) * ms for _, s, _ in spans],
            x=[max(e - s, 0.0) * ms for _, s, e in spans], y=[y] * len(spans), width=_BAR,
            marker=dict(color=[_COMPUTE[j % 2] for j in range(len(spans))],
                        line=dict(color="white", width=1)),
            name="backward compute", legendgroup="compute", showlegend=rank == ranks[0],
            customdata=[label for label, _, _ in spans],
            hovertemplate=f"rank {rank}: %{{customdata}}<br>%{{x:.3f}} ms<extra></extra>"))
        mine = sorted((e for e in events if e.rank == rank), key=lambda e: e.start)
        ends = [e.end if e.end is not None else e.start for e in mine]
        lanes = greedy_lanes([(e.start, end) for e, end in zip(mine, ends)])
        first = y + 1
        y = first + max(lanes, default=0)
        ticks.append(((first + y) / 2, f"rank {rank} all-reduce"))
        widths = [(end - e.start) * ms for e, end in zip(mine, ends)]
        labels = _labelled([f"b{i}" for i in range(len(mine))], widths, span_ms)
        hidden += labels.count("")
        fig.add_trace(go.Bar(
            orientation="h", base=[(e.start - t0) * ms for e in mine], x=widths,
            y=[first + lane for lane in lanes], width=_BAR,
            marker=dict(color=_ALL_REDUCE,
                        opacity=[0.55 + 0.45 * (i % 2) for i in range(len(mine))],
                        line=dict(color="white", width=1)),
            name="all-reduce (one per bucket)", legendgroup="comm", showlegend=rank == ranks[0],
            text=labels, textposition="inside", insidetextanchor="middle", textangle=0,
            textfont=dict(size=_LABEL_FONT, color="white"),
            customdata=[[i, f"{e.nbytes:,}", human_bytes(e.nbytes)] for i, e in enumerate(mine)],
            hovertemplate=(f"rank {rank}: bucket %{{customdata[0]}}, %{{customdata[1]}} bytes "
                           "(%{customdata[2]})<br>%{x:.3f} ms<extra></extra>")))
        y += 1 + _RANK_GAP
    rows = y - _RANK_GAP
    fig.update_layout(title=title, barmode="overlay", height=150 + _ROW_PX * rows,
                      xaxis_title="time since backward started (ms)",
                      yaxis=dict(tickvals=[t for t, _ in ticks], ticktext=[n for _, n in ticks],
                                 autorange="reversed", zeroline=False, showgrid=False),
                      uniformtext=dict(minsize=_LABEL_FONT, mode="hide"),
                      legend=dict(orientation="h", y=-0.25), margin=dict(l=130, r=20, t=60, b=40))
    if hidden:
        fig.add_annotation(text=f"b0, b1, …: each bucket's all-reduce; {hidden} bar(s) too narrow "
                                "for a label: hover for their bucket", showarrow=False,
                           xref="paper", yref="paper", x=1, y=1.0, xanchor="right",
                           yanchor="bottom", font_size=11)
    return fig


def dp_step_time(p: int, *, batch: int, seconds_per_item: float, grad_bytes: float,
                 link: AlphaBeta, overlap: float = 0.0) -> dict[str, float]:
    """Seconds of one data-parallel step on ``p`` ranks for a global batch of ``batch`` items.

    compute = seconds_per_item · ⌈batch/p⌉ (the slowest rank has the rounded-up share);
    comm = the ring all-reduce of ``grad_bytes`` (0 for p = 1); a fraction ``overlap`` (0..1) of
    comm hidden behind backward, at most the compute time. Returns compute, comm, exposed comm
    and total. Raises ValueError when p > batch: a rank with no item has nothing to compute.
    """
    check_ints("dp_step_time", p=p, batch=batch)
    if p > batch:
        raise ValueError(f"dp_step_time: p = {p} ranks > batch = {batch} items: data parallelism "
                         "needs at least one item per rank (P <= B)")
    check_positives("dp_step_time", seconds_per_item=seconds_per_item, grad_bytes=grad_bytes)
    if not 0.0 <= overlap <= 1.0:
        raise ValueError(f"dp_step_time: overlap must be in [0, 1], got {overlap!r}")
    compute = seconds_per_item * -(-batch // p)
    comm = float(predict("all_reduce", "ring", grad_bytes, p, link)) if p > 1 else 0.0
    exposed = comm - min(overlap * comm, compute)
    return {"compute": compute, "comm": comm, "exposed comm": exposed, "total": compute + exposed}


def scaling_table(ps: Sequence[int], **kwargs) -> list[dict[str, float]]:
    """`dp_step_time` for each p (those ≤ batch), with speedup T(1)/T(p) and efficiency
    speedup/p."""
    one = dp_step_time(1, **kwargs)["total"]
    rows = []
    for p in ps:
        if p > kwargs["batch"]:
            continue
        t = dp_step_time(p, **kwargs)
        rows.append({"p": p, "items per rank": -(-kwargs["batch"] // p), **t,
                     "speedup": one / t["total"], "efficiency": one / (p * t["total"])})
    return rows


def scaling_figure(rows: Sequence[Mapping[str, float]], *,
                   title: str = "data-parallel step time and efficiency") -> go.Figure:
    """Stacked compute / exposed-comm time per p (left axis, ms) and efficiency (right axis)."""
    if not rows:
        raise ValueError("scaling_figure: rows is empty")
    x = [str(r["p"]) for r in rows]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=x, y=[r["compute"] * 1e3 for r in rows], name="compute (ms)",
                         marker_color=_COMPUTE[1]))
    fig.add_trace(go.Bar(x=x, y=[r["exposed comm"] * 1e3 for r in rows],
                         name="exposed all-reduce (ms)", marker_color=_ALL_REDUCE))
    fig.add_trace(go.Scatter(x=x, y=[r["efficiency"] for r in rows], name="efficiency",
                             yaxis="y2", mode="lines+markers", line_color="#d62728"))
    fig.update_layout(title=title, barmode="stack", height=380, xaxis_title="ranks P",
                      yaxis=dict(title="time per step (ms)"),
                      # Ticks at round values, set explicitly: plotly would otherwise line an
                      # overlaying axis's ticks up with the left axis's (0.226, 0.452, ...).
                      yaxis2=dict(title="efficiency T(1)/(P·T(P))", overlaying="y", side="right",
                                  range=[0, 1.05], tickmode="array", tickvals=EFFICIENCY_TICKS,
                                  ticktext=[f"{t:g}" for t in EFFICIENCY_TICKS], showgrid=False),
                      legend=dict(orientation="h", y=-0.25))
    return fig


def stale_sgd(staleness: int, *, lr: float, steps: int,
              curvatures: Sequence[float] = (1.0, 10.0),
              start: Sequence[float] | None = None) -> list[float]:
    """Loss per step of SGD on f(w) = ½ Σ_i h_i w_i² when each gradient is ``staleness`` steps old.

    w_{t+1} = w_t − lr · ∇f(w_{t−k}) with k = ``staleness`` (w before step 0 is the start): what
    a worker of an asynchronous parameter server applies when k other updates landed while it
    computed. k = 0 is plain (synchronous) gradient descent, stable for lr < 2/max h; delay
    shrinks the stable range: one coordinate converges iff 0 < lr·h < 2 sin(π/(2(2k+1)))
    (Levin & May, "A note on difference-delay equations", Theor. Pop. Biol. 1976): 2 at k = 0,
    1 at k = 1, 0.445 at k = 3.
    Returns f(w_t) for t = 0..steps (inf once it overflows).
    """
    check_int("stale_sgd", "staleness", staleness, low=0)
    check_int("stale_sgd", "steps", steps)
    check_positive("stale_sgd", "lr", lr)
    h = [float(c) for c in curvatures]
    w = [1.0] * len(h) if start is None else [float(s) for s in start]
    if len(w) != len(h):
        raise ValueError(f"stale_sgd: start has {len(w)} values, curvatures {len(h)}")
    history = [list(w)] * (staleness + 1)   # history[0]: the weights of k steps ago

    def loss(v: list[float]) -> float:
        value = 0.5 * sum(hi * vi * vi for hi, vi in zip(h, v))
        return value if math.isfinite(value) else float("inf")   # diverged

    losses = [loss(w)]
    for _ in range(steps):
        old = history[0]
        if losses[-1] == float("inf"):
            losses.append(float("inf"))
            continue
        w = [wi - lr * hi * oi for wi, hi, oi in zip(w, h, old)]
        history = history[1:] + [w]
        losses.append(loss(w))
    return losses
