"""The recomputation trade-off of one model: activation memory against extra FLOPs for every
policy (none, flash-style attention, selective, full recomputation in segments of k layers).

Memory per GPU of L transformer layers (t = 1, one micro-batch), from `toolkit.memory`
(Korthikanti et al. 2022, Table 2) and Chen et al. 2016's segment model (`toolkit.recompute`):

    none        L · act                      act = s·b·h·(34 + 5·a·s/h)
    flash       L · s·b·h·34                 no stored scores
    selective   L · s·b·h·34 + one layer's scores (rerun in backward)
    segments k  ⌈L/k⌉ · 2·s·b·h + k · act    inputs held, one segment rerun

Extra FLOPs per token, as a share of the model's 6N + 12·L·h·s (`toolkit.flops`): full
recomputation one forward (2N + 4·L·h·s, any k), selective the attention core (4·L·h·s), a
flash-style kernel its rerun q·kᵀ (2·L·h·s). Pure functions: numbers in, a figure out.
"""

from __future__ import annotations

import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..flops import flash_recompute_flops, flops_per_token, recompute_flops
from ..memory import GiB, activation_bytes_per_layer, model_shape
from ..models import GPTConfig
from ..memory.checkpointing import best_every, chen_memory

__all__ = ["recompute_tradeoff", "recompute_view", "sweep_figure"]

COLORS = {"none": "#d62728", "flash": "#17becf", "selective": "#2ca02c", "segments": "#1f77b4"}


def recompute_tradeoff(*, model: str, seq_len: int, batch: int) -> dict:
    """The numbers the view draws: per-layer bytes (`input`, `act`, `kept`: what flash and
    selective keep), memory in bytes per policy (`memory`, and `segments` for k = 1 … L),
    extra FLOPs as a fraction of the model's (`extra`), the best k and √(L·a/c)."""
    shape = model_shape(model)
    L, h, a = shape.layers, shape.hidden, shape.heads
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"recompute_tradeoff: batch must be an int >= 1, got {batch!r}")
    kw = dict(seq_len=seq_len, batch=batch, hidden=h, heads=a)
    act = activation_bytes_per_layer(**kw)
    kept = activation_bytes_per_layer(**kw, recompute="selective")
    a_in = activation_bytes_per_layer(**kw, recompute="full")  # the layer's input, 2·s·b·h
    cfg = GPTConfig(vocab_size=shape.vocab, seq_len=max(seq_len, shape.seq_len), d_model=h,
                    n_head=a, n_layer=L)  # only sizes: nothing is allocated
    model_flops = flops_per_token(cfg, seq_len=seq_len)
    segments = {k: chen_memory(L, k, input_bytes=a_in, block_bytes=act) for k in range(1, L + 1)}
    return dict(
        name=shape.name, layers=L, input=a_in, act=act, kept=kept, segments=segments,
        memory={"none": L * act, "flash": L * kept, "selective": L * kept + (act - kept)},
        extra={"none": 0.0, "flash": flash_recompute_flops(cfg, seq_len=seq_len) / model_flops,
               "selective": recompute_flops(cfg, seq_len=seq_len, recompute="selective")
               / model_flops,
               "segments": recompute_flops(cfg, seq_len=seq_len, recompute="full") / model_flops},
        best=best_every(L, input_bytes=a_in, block_bytes=act),
        sqrt_rule=math.sqrt(L * a_in / act))


def recompute_view(*, model: str, seq_len: int, batch: int) -> tuple[go.Figure, str]:
    """(figure, HTML verdict): left, memory against the segment length k with the other
    policies as lines; right, memory against extra FLOPs, one point per policy."""
    t = recompute_tradeoff(model=model, seq_len=seq_len, batch=batch)
    ks = list(t["segments"])
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12, subplot_titles=(
        "activation memory vs segment length k", "activation memory vs extra FLOPs"))
    fig.add_trace(go.Scatter(x=ks, y=[t["segments"][k] / GiB for k in ks], mode="lines+markers",
                             name="full recomputation, segments of k",
                             line_color=COLORS["segments"]), row=1, col=1)
    fig.add_trace(go.Scatter(x=[t["best"]], y=[t["segments"][t["best"]] / GiB], mode="markers",
                             marker=dict(symbol="star", size=14, color="black"),
                             name=f"best k = {t['best']}"), row=1, col=1)
    for policy in ("none", "flash", "selective"):
        fig.add_trace(go.Scatter(x=[ks[0], ks[-1]], y=[t["memory"][policy] / GiB] * 2,
                                 mode="lines", line=dict(dash="dash", color=COLORS[policy]),
                                 name=policy, legendgroup=policy), row=1, col=1)
        fig.add_trace(go.Scatter(x=[100 * t["extra"][policy]], y=[t["memory"][policy] / GiB],
                                 mode="markers+text", text=[policy], textposition="top right",
                                 marker=dict(size=11, color=COLORS[policy]), showlegend=False,
                                 legendgroup=policy), row=1, col=2)
    fig.add_trace(go.Scatter(x=[100 * t["extra"]["segments"]] * len(ks),
                             y=[t["segments"][k] / GiB for k in ks], mode="markers",
                             text=[f"k = {k}" for k in ks], marker_color=COLORS["segments"],
                             showlegend=False, hovertemplate="%{text}: %{y:.3g} GiB"),
                  row=1, col=2)
    fig.update_yaxes(title_text="GiB per GPU (t = 1)", type="log", row=1, col=1)
    fig.update_yaxes(type="log", row=1, col=2)
    fig.update_xaxes(title_text="segment length k (layers)", row=1, col=1)
    fig.update_xaxes(title_text="extra FLOPs, % of the model's", row=1, col=2)
    fig.update_layout(height=420, title=f"{t['name']}: s = {seq_len}, b = {batch}, "
                                        f"{t['layers']} layers", margin=dict(t=80))
    best = t["best"]
    verdict = (f"A layer keeps <b>{t['act'] / 2 ** 20:.4g} MiB</b> for its backward and takes a "
               f"{t['input'] / 2 ** 20:.4g} MiB input: c/a = {t['act'] / t['input']:.1f}, so "
               f"Chen's best segment is <b>k = {best}</b> (√(L·a/c) = {t['sqrt_rule']:.2f}), "
               f"{t['segments'][best] / GiB:.3g} GiB for +{100 * t['extra']['segments']:.0f} % "
               f"FLOPs. Selective recomputation: {t['memory']['selective'] / GiB:.3g} GiB for "
               f"+{100 * t['extra']['selective']:.1f} %; flash-style attention "
               f"{t['memory']['flash'] / GiB:.3g} GiB (+{100 * t['extra']['flash']:.1f} %, "
               f"inside the kernel); none {t['memory']['none'] / GiB:.3g} GiB.")
    return fig, verdict


def sweep_figure(table, *, unit_bytes: float, unit: str, formula: str | None = None,
                 title: str = "") -> go.Figure:
    """A `toolkit.experiments.recompute.sweep` table drawn: left, the measured peak (in `unit`s of
    `unit_bytes`) per case, with the column `formula` (bytes) as a line when given; right, the
    step time per case, the median over ranks with the spread between ranks as an error bar."""
    cases = list(table.index)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1, subplot_titles=(
        f"peak activation memory ({unit}s)", "step time, median over ranks (ms)"))
    fig.add_trace(go.Bar(x=cases, y=table["peak"] / unit_bytes, name="measured peak",
                         marker_color=COLORS["segments"]), row=1, col=1)
    if formula is not None:
        fig.add_trace(go.Scatter(x=cases, y=table[formula] / unit_bytes, mode="lines+markers",
                                 name=formula, line_color="black"), row=1, col=1)
    fig.add_trace(go.Scatter(x=cases, y=1e3 * table["step_s"], mode="markers",
                             error_y=dict(type="data", array=500 * table["spread_s"]),
                             name="step time (± half the spread)",
                             marker_color=COLORS["none"]), row=1, col=2)
    fig.update_layout(height=380, title=title, margin=dict(t=80), legend=dict(orientation="h"))
    return fig
