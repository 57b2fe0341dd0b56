"""Figures of lesson 03's two refinements of the α-β model: the piecewise model over measured
times with its size regimes (`regime_curves`), and the sliced ring's speed-up per slice count
beside the α-β-γ model (`slice_speedups`).

Models: `toolkit.cost.piecewise` (one α, β per size regime, boundaries from the data) and
`toolkit.cost.slicing` (t(S) = 2(p−1)·S·α + 2(p−1)/p·n·β + (p−1)/p·n·γ/S). Tables are what
`toolkit.experiments.collectives.measure` returns. Pure functions: data in, plotly figure out.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import plotly.graph_objects as go

from ..chunks import ring_slices
from ..cost import AlphaBeta, PiecewiseFit, predict, slicing_speedup
from ..cost.choose import human_bytes
from ..cost.models import split_label
from .cost import _MS, _color, _panels, _series, _table


def regime_curves(table: Any, fits: Mapping[tuple[str, int], PiecewiseFit], *,
                  collective: str | None = None, title: str | None = None) -> go.Figure:
    """Measured time per call (median, bars: interquartile range) against size, one panel per
    p, and each fitted piecewise model dotted, regime by regime, with its boundaries marked.

    `fits` maps (algorithm, p) to a `PiecewiseFit` of those rows; algorithms without one are
    drawn measured only.
    """
    df, collective = _table(table, "regime_curves", collective, ["seconds"])
    for (alg, p), fit in fits.items():
        if not isinstance(fit, PiecewiseFit):
            raise TypeError(f"regime_curves: fits[{(alg, p)!r}] must be a PiecewiseFit, got "
                            f"{type(fit).__name__}")
    ps = sorted(int(p) for p in set(df.p))
    fig = _panels(ps, df.nbytes, y_title="time per call (ms)", y_log=True, title=title or (
        f"{collective}: measured (bars: interquartile range); dotted: piecewise α-β model, "
        "| regime boundary"))
    extra: dict[str, str] = {}
    for col, p, alg, rows in _series(df, ps):
        color = _color(alg, extra)
        err = None
        if {"q25_seconds", "q75_seconds"} <= set(rows.columns):
            err = dict(type="data", symmetric=False, color=color, thickness=1,
                       array=(rows.q75_seconds - rows.seconds) * _MS,
                       arrayminus=(rows.seconds - rows.q25_seconds) * _MS)
        fig.add_trace(go.Scatter(
            x=rows.nbytes, y=rows.seconds * _MS, mode="markers", name=alg, legendgroup=alg,
            showlegend=col == 1, marker=dict(color=color, size=7), error_y=err,
            customdata=[human_bytes(n) for n in rows.nbytes],
            hovertemplate=f"<b>{alg}</b>, p={p}<br>%{{customdata}}: %{{y:.3f}} ms"
                          "<extra>measured (median)</extra>"), row=1, col=col)
        fit = fits.get((alg, p))
        if fit is None:
            continue
        lo, hi = float(rows.nbytes.min()), float(rows.nbytes.max())
        for k, reg in enumerate(fit.model.regimes):
            a, b = max(lo, reg.lo), min(hi, reg.hi)
            if a >= b:
                continue
            grid = np.geomspace(a, b, 30)
            fig.add_trace(go.Scatter(
                x=grid, mode="lines", showlegend=False,   # the regime's own link, ends too
                y=predict(collective, fit.model.algorithm, grid, p, reg.link) * _MS,
                name=f"{alg} regime {k + 1}", legendgroup=alg,
                line=dict(color=color, dash="dot", width=2),
                hovertemplate=(f"<b>{alg}</b>, p={p}, regime {k + 1}<br>{reg.link}"
                               "<extra>piecewise model</extra>")), row=1, col=col)
        for edge in fit.model.boundaries:
            fig.add_vline(x=edge, line=dict(color=color, dash="dash", width=1),
                          row=1, col=col)
    return fig


def slice_speedups(table: Any, *, links: Mapping[int, AlphaBeta] | None = None,
                   gamma: float | None = None, title: str | None = None) -> go.Figure:
    """Speed-up of the sliced ring over the simple ring, t(ring) / t(sliced), against the slices
    per chunk S, one panel per p, one line per size.

    The table holds ``"ring"`` rows and ``"sliced_ring:slice_bytes=..."`` rows (the benchmark's
    ``--slices``) of all-reduce. With `links` (α, β per p) and `gamma` (seconds per byte added),
    the α-β-γ model's t(1)/t(S) is drawn dotted for each size.
    """
    df, collective = _table(table, "slice_speedups", "all_reduce", ["seconds"])
    rows = []
    for r in df.itertuples():
        name, options = split_label(r.algorithm)
        if name == "sliced_ring" and "slice_bytes" in options:
            rows.append((int(r.p), int(r.nbytes), ring_slices(int(r.numel), int(r.p),
                         int(r.nbytes) // int(r.numel), options["slice_bytes"]), r.seconds))
    if not rows:
        raise ValueError("slice_speedups: no 'sliced_ring:slice_bytes=...' rows in the table "
                         "(run benchmarks/collectives.py with --slices)")
    if (links is None) != (gamma is None):
        raise ValueError("slice_speedups: give both links and gamma for the model, or neither")
    simple = {(int(r.p), int(r.nbytes)): r.seconds for r in df.itertuples()
              if r.algorithm == "ring"}
    ps = sorted({p for p, *_ in rows})
    fig = _panels(ps, [1, 2], y_title="speed-up over the simple ring", y_log=False,
                  title=title or "sliced ring: t(simple ring) / t(sliced ring) per slice count"
                  + ("; dotted: α-β-γ model" if links else ""))
    fig.update_xaxes(type="log", title_text="slices per chunk S", tickvals=None, ticktext=None)
    extra: dict[str, str] = {}
    for col, p in enumerate(ps, start=1):
        for n in sorted({n for q, n, *_ in rows if q == p}):
            if (p, n) not in simple:
                continue
            best: dict[int, float] = {}
            for q, m, s, sec in rows:   # several slice sizes can give one S: keep the fastest
                if q == p and m == n:
                    best[s] = min(sec, best.get(s, float("inf")))
            ss = sorted(best)
            color = _color(human_bytes(n), extra)
            fig.add_trace(go.Scatter(
                x=ss, y=[simple[(p, n)] / best[s] for s in ss], mode="lines+markers",
                name=human_bytes(n), legendgroup=str(n), showlegend=col == 1,
                line=dict(color=color),
                hovertemplate=f"{human_bytes(n)}, p={p}<br>S = %{{x}}: %{{y:.2f}}×"
                              "<extra>measured</extra>"), row=1, col=col)
            if links is not None and p in links:
                grid = np.unique(np.geomspace(1, max(ss), 40).round())
                fig.add_trace(go.Scatter(
                    x=grid, y=slicing_speedup(n, p, links[p], gamma=gamma, slices=grid),
                    mode="lines", showlegend=False, legendgroup=str(n),
                    line=dict(color=color, dash="dot"), name=f"{human_bytes(n)} model",
                    hovertemplate="S = %{x}: %{y:.2f}×<extra>α-β-γ model</extra>"),
                    row=1, col=col)
        fig.add_hline(y=1, line=dict(color="black", width=1, dash="dash"), row=1, col=col)
    fig.update_layout(legend_title_text="size")
    return fig
