"""Figures of training memory per device: stacked bars of parameters, gradients, optimizer
state and activations, per ZeRO stage (`memory_bars`, `stage_bars`), and measured bytes of
real runs beside the prediction (`measured_vs_predicted`).

The numbers come from `toolkit.memory` (ZeRO, SC 2020, §5; Korthikanti et al. 2022) or from
`toolkit.experiments.memory`; these functions only draw them. Pure functions: data in, plotly
figure out; no processes, no widgets.

Sizes are drawn in the course's one unit convention (`toolkit.formats`): IEC binary units,
KiB = 2¹⁰ … GiB = 2³⁰ bytes, picked from the largest bar by `byte_unit` unless `unit` names
one, and a device's memory is labelled with `human_bytes`. The ZeRO paper counts decimal GB
(10⁹ bytes): its Figure 1's "120 GB" is drawn as 112 GiB.
"""

from __future__ import annotations

from typing import Any, Mapping

import plotly.graph_objects as go

from ..formats import BYTE_UNITS, byte_unit, human_bytes
from ..memory import MIXED_ADAM, Budget, ModelStates, Recipe, model_state_bytes

PARTS = ("params", "grads", "optimizer", "activations")
"""What a bar stacks, bottom to top."""
COLORS = {"params": "#1f77b4", "grads": "#ff7f0e", "optimizer": "#2ca02c",
          "activations": "#9467bd"}
"""One colour per part in every memory figure of the course."""
_UNITS = dict(BYTE_UNITS)  # IEC: B, KiB, MiB, GiB, TiB (toolkit.formats)


def _scale(owner: str, unit: str | None, largest: float) -> tuple[str, float]:
    """(unit, bytes per unit): `unit` if given (an IEC name), else the one `byte_unit` picks
    for the largest value drawn."""
    if unit is None:
        return byte_unit(largest)
    if unit not in _UNITS:
        raise ValueError(f"{owner}: unit must be one of {list(_UNITS)} (IEC binary units, the "
                         f"course's convention: toolkit.formats) or None to pick one, "
                         f"got {unit!r}")
    return unit, _UNITS[unit]


def _parts(value: Budget | ModelStates | Mapping[str, float]) -> dict[str, float]:
    if isinstance(value, Budget):
        return value.as_dict()
    if isinstance(value, ModelStates):
        return {"params": value.params, "grads": value.grads, "optimizer": value.optimizer}
    if isinstance(value, Mapping):
        unknown = set(value) - set(PARTS)
        if unknown:
            raise ValueError(f"memory_bars: unknown parts {sorted(unknown)}; expected {PARTS}")
        return {k: float(v) for k, v in value.items()}
    raise TypeError(f"memory_bars: each bar must be a Budget, ModelStates or a mapping of "
                    f"{PARTS} to bytes, got {type(value).__name__}")


def memory_bars(bars: Mapping[str, Budget | ModelStates | Mapping[str, float]], *,
                gpu_bytes: float | None = None, unit: str | None = None, title: str = "",
                highlight: str | None = None) -> go.Figure:
    """One stacked bar per entry of `bars` (label → bytes by part), a dashed line at
    `gpu_bytes` when given, the total written above each bar. `highlight` outlines one bar.
    `unit`: an IEC unit ("MiB", "GiB", ...), or None for the one that suits the largest bar."""
    if not bars:
        raise ValueError("memory_bars: no bars to draw")
    labels = list(bars)
    parts = {label: _parts(v) for label, v in bars.items()}
    largest = max([sum(p.values()) for p in parts.values()] + [gpu_bytes or 0.0])
    unit, scale = _scale("memory_bars", unit, largest)
    fig = go.Figure()
    for part in PARTS:
        ys = [parts[label].get(part, 0.0) / scale for label in labels]
        if not any(ys):
            continue
        fig.add_bar(x=labels, y=ys, name=part, marker_color=COLORS[part],
                    marker_line_width=[3 if label == highlight else 0 for label in labels],
                    marker_line_color="black",
                    hovertemplate=f"%{{x}}<br>{part}: %{{y:.4g}} {unit}<extra></extra>")
    totals = [sum(parts[label].values()) / scale for label in labels]
    fig.add_scatter(x=labels, y=totals, mode="text", text=[f"{_fmt(t)} {unit}" for t in totals],
                    textposition="top center", showlegend=False, hoverinfo="skip")
    if gpu_bytes is not None:
        fig.add_hline(y=gpu_bytes / scale, line_dash="dash", line_color="#d62728",
                      annotation_text=f"device memory {human_bytes(gpu_bytes)}",
                      annotation_position="top left")
    top = max(totals + ([gpu_bytes / scale] if gpu_bytes else []))
    fig.update_layout(barmode="stack", title=title or "memory per device", height=420,
                      yaxis=dict(title=f"{unit} per device", range=[0, top * 1.15]),
                      legend=dict(orientation="h", y=-0.15), margin=dict(t=60, b=40))
    return fig


def _fmt(value: float) -> str:
    """3 significant digits without exponents: 0.0123, 1.88, 31.4, 3,070."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def stage_bars(num_params: float, n_d: int, *, recipe: Recipe = MIXED_ADAM,
               activations: float = 0.0, gpu_bytes: float | None = None,
               highlight: int | None = None, unit: str | None = None,
               title: str = "") -> go.Figure:
    """Stacked bars of model states per device for ZeRO stages 0-3 (`model_state_bytes`),
    with the same `activations` on each (data parallelism does not split them)."""
    bars = {}
    for stage in range(4):
        s = model_state_bytes(num_params, n_d, stage, recipe)
        bars[_stage_label(stage)] = {"params": s.params, "grads": s.grads,
                                     "optimizer": s.optimizer, "activations": activations}
    title = title or (f"Ψ = {num_params:.3g} parameters, N_d = {n_d}, {recipe.name}")
    return memory_bars(bars, gpu_bytes=gpu_bytes, unit=unit, title=title,
                       highlight=None if highlight is None else _stage_label(highlight))


def _stage_label(stage: int) -> str:
    return ("stage 0 (DP)", "stage 1 (os)", "stage 2 (os+g)", "stage 3 (os+g+p)")[stage]


def measured_vs_predicted(frame: Any, *, rank: int = 0, unit: str | None = None,
                          title: str = "") -> go.Figure:
    """Measured bytes of one rank beside the padded prediction, per method: pairs of stacked
    bars from `toolkit.experiments.memory.predicted_rows`. The x axis is (method,
    measured|predicted); `unit` as in `memory_bars`."""
    need = {"method", "rank", "params", "grads", "optimizer", "padded_params",
            "padded_grads", "padded_optimizer"}
    if not hasattr(frame, "columns") or need - set(frame.columns):
        raise ValueError(f"measured_vs_predicted: expected the frame of predicted_rows with "
                         f"columns {sorted(need)}")
    rows = frame[frame["rank"] == rank]
    if rows.empty:
        raise ValueError(f"measured_vs_predicted: no rows for rank {rank}")
    largest = max(max(rows[[p for p in ("params", "grads", "optimizer")]].sum(axis=1)),
                  max(rows[[f"padded_{p}" for p in ("params", "grads", "optimizer")]].sum(axis=1)))
    unit, scale = _scale("measured_vs_predicted", unit, float(largest))
    methods = list(rows.method)
    x = [sum(([m, m] for m in methods), []), ["measured", "predicted"] * len(methods)]
    fig = go.Figure()
    for part in ("params", "grads", "optimizer"):
        ys = []
        for _, r in rows.iterrows():
            ys += [r[part] / scale, r[f"padded_{part}"] / scale]
        fig.add_bar(x=x, y=ys, name=part, marker_color=COLORS[part],
                    hovertemplate=f"{part}: %{{y:.6g}} {unit}<extra></extra>")
    n = int(rows.world_size.iloc[0]) if "world_size" in rows else None
    fig.update_layout(barmode="stack", height=420, legend=dict(orientation="h", y=-0.25),
                      title=title or f"rank {rank}" + (f" of {n}" if n else "")
                      + ": bytes held after training, measured vs predicted",
                      yaxis_title=f"{unit} on rank {rank}", margin=dict(t=60, b=40))
    return fig


__all__ = ["COLORS", "PARTS", "measured_vs_predicted", "memory_bars", "stage_bars"]
