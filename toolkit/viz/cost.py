"""Figures of what collectives cost: measured times with the α-β model over them (`cost_curves`),
nccl-tests bus bandwidth (`bus_bandwidth`), the model's predictions per algorithm with the sizes
where the fastest one changes (`predicted_times`), the model's two terms as p grows
(`cost_terms`), and bytes and rounds per rank as p grows (`traffic_and_rounds`). Two small
helpers of the model's answers sit beside them: `fastest` (which algorithm wins at one size) and
`switch_points` (the sizes where the winner changes); `human_bytes` labels sizes.

The model (Hockney; Thakur, Rabenseifner & Gropp, IJHPCA 2005) is `toolkit.cost`'s
t = a(p)·α + b(p)·n·β; these functions only draw it. Measured tables are what
`toolkit.experiments.collectives.measure` returns (columns collective, algorithm, p, nbytes,
seconds, busbw). Pure functions: data in, plotly figure out; no processes, no widgets.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from .. import cost
from ..cost import AlphaBeta, Fit
from ..cost.choose import check_algorithms, check_p_link, fastest, human_bytes, switch_points
from ..cost.models import algorithms as modelled_algorithms

# One colour per algorithm name in every figure of the course (the built-in in grey).
_COLORS = {"ring": "#1f77b4", "ps": "#d62728", "sharded_ps": "#ff7f0e", "tree": "#2ca02c",
           "linear": "#9467bd", cost.TORCH: "#7f7f7f"}
_MS = 1e3  # seconds → milliseconds, the unit of every time axis here


def _color(name: str, extra: dict[str, str]) -> str:
    if name in _COLORS:
        return _COLORS[name]
    return extra.setdefault(name, qualitative.Dark24[len(extra) % len(qualitative.Dark24)])


def _table(table: Any, name: str, collective: str | None, need: Iterable[str]):
    """The rows of one collective, checked: a DataFrame with the columns `need`."""
    if not hasattr(table, "columns"):
        raise TypeError(f"{name}: expected the DataFrame from "
                        f"toolkit.experiments.collectives.measure, got {type(table).__name__}")
    missing = ({"collective", "algorithm", "p", "nbytes"} | set(need)) - set(table.columns)
    if missing:
        raise ValueError(f"{name}: the table lacks columns {sorted(missing)}")
    if collective is not None:
        table = table[table.collective == collective]
    if table.empty:
        where = f" for {collective!r}" if collective else ""
        raise ValueError(f"{name}: no rows to draw{where}")
    kinds = sorted(set(table.collective))
    if len(kinds) > 1:
        raise ValueError(f"{name}: the table mixes collectives {kinds}; pass collective=... "
                         "to pick one")
    if (table.nbytes <= 0).any():
        raise ValueError(f"{name}: sizes must be > 0 bytes on a log axis")
    return table, kinds[0]


def _size_axis(lo: float, hi: float) -> dict:
    """A log x axis of bytes, ticked at powers of 4 (or of 32 over wide ranges) from 1 KiB,
    labelled '4 KiB', '1 MiB', ... instead of plotly's decimal '4.1k'."""
    for base in (4, 32, 1024):
        ticks = [1024 * base ** k for k in range(-5, 12) if lo <= 1024 * base ** k <= hi]
        if len(ticks) <= 11:
            break
    return dict(type="log", title_text="message size n (bytes)", tickvals=ticks,
                ticktext=[human_bytes(t) for t in ticks])


_LOG_TIME = dict(type="log", dtick=1, tickformat=",~r")  # a label per decade: 0.1, 1, 10, 1,000


def _panels(ps: Sequence[int], sizes: Any, *, title: str, y_title: str,
            y_log: bool) -> go.Figure:
    fig = make_subplots(rows=1, cols=len(ps), shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=[f"p = {p} ranks" for p in ps])
    fig.update_xaxes(**_size_axis(float(min(sizes)), float(max(sizes))))
    fig.update_yaxes(**(_LOG_TIME if y_log else dict(type="linear", rangemode="tozero")))
    fig.update_yaxes(title_text=y_title, col=1)
    fig.update_layout(title=title, height=420, legend_title_text="algorithm",
                      margin=dict(l=70, r=20, t=80, b=50))
    return fig


def _series(df: Any, ps: Sequence[int]):
    """(panel column, p, algorithm, its rows sorted by size) for every non-empty series."""
    for col, p in enumerate(ps, start=1):
        for alg in dict.fromkeys(df.algorithm):
            rows = df[(df.algorithm == alg) & (df.p == p)].sort_values("nbytes")
            if not rows.empty:
                yield col, p, alg, rows


def _link_of(fits: Any, algorithm: str, p: int) -> AlphaBeta | None:
    """The link to draw for (algorithm, p): a (algorithm, p) key first, then the algorithm."""
    if fits is None:
        return None
    if isinstance(fits, (AlphaBeta, Fit)):
        found = fits
    else:
        found = fits.get((algorithm, p), fits.get(algorithm))
    return found.link if isinstance(found, Fit) else found


def _check_fits(fits: Any, algorithms: set[str], collective: str, name: str) -> None:
    if fits is None or isinstance(fits, (AlphaBeta, Fit)):
        return
    if not isinstance(fits, Mapping):
        raise TypeError(f"{name}(fits=...) takes an AlphaBeta, a Fit, or a dict of them keyed by "
                        f"algorithm or (algorithm, p); got {type(fits).__name__}")
    for key, value in fits.items():
        alg = key[0] if isinstance(key, tuple) else key
        if alg not in algorithms:
            raise ValueError(f"{name}: fits names algorithm {alg!r}, which is not in the table "
                             f"({', '.join(sorted(algorithms))})")
        cost.coefficients(collective, alg, 2)  # no model for it (e.g. "torch"): say so now
        if not isinstance(value, (AlphaBeta, Fit)):
            raise TypeError(f"{name}: fits[{key!r}] must be an AlphaBeta or a Fit, "
                            f"got {type(value).__name__}")


def cost_curves(table: Any, fits: Any = None, *, collective: str | None = None,
                title: str | None = None) -> go.Figure:
    """Measured time per call against size, log-log, one panel per world size p.

    One colour per algorithm (markers and a solid line: the measurement). With `fits`, the α-β
    model t = a(p)·α + b(p)·n·β is drawn dotted in the same colour over the measured range:
    `fits` is one `AlphaBeta` or `Fit` for every algorithm that has a model (the built-in
    ``"torch"`` has none and is left without), or a dict of them keyed by algorithm name or by
    (algorithm, p), the (algorithm, p) key winning. Times in ms.
    """
    df, collective = _table(table, "cost_curves", collective, ["seconds"])
    if not (df.seconds > 0).all():
        raise ValueError("cost_curves: measured seconds must be > 0 on a log axis")
    algorithms = list(dict.fromkeys(df.algorithm))
    _check_fits(fits, set(algorithms), collective, "cost_curves")
    ps = sorted(int(p) for p in set(df.p))
    fig = _panels(ps, df.nbytes, y_title="time per call (ms)", y_log=True, title=title or (
        f"{collective}: measured time per call"
        + ("; dotted: α-β model" if fits is not None else "")))
    extra: dict[str, str] = {}
    modelled = set(modelled_algorithms(collective))  # the sliced ring draws the ring's model
    for col, p, alg, rows in _series(df, ps):
        color = _color(alg, extra)
        busbw = rows.busbw / 1e9 if "busbw" in rows else [float("nan")] * len(rows)
        fig.add_trace(go.Scatter(
            x=rows.nbytes, y=rows.seconds * _MS, mode="lines+markers", name=alg,
            legendgroup=alg, showlegend=col == 1, line=dict(color=color),
            customdata=[[human_bytes(n), b] for n, b in zip(rows.nbytes, busbw)],
            hovertemplate=(f"<b>{alg}</b>, p={p}<br>%{{customdata[0]}}: %{{y:.3f}} ms"
                           "<br>busbw %{customdata[1]:.2f} GB/s<extra>measured</extra>")),
            row=1, col=col)
        link = _link_of(fits, alg, p) if alg in modelled else None
        if link is None:
            continue
        grid = np.geomspace(rows.nbytes.min(), rows.nbytes.max(), 60)
        fig.add_trace(go.Scatter(
            x=grid, y=cost.predict(collective, alg, grid, p, link) * _MS, mode="lines",
            name=f"{alg} model", legendgroup=alg, showlegend=False,
            line=dict(color=color, dash="dot", width=2),
            hovertemplate=(f"<b>{alg} model</b>, p={p}<br>{link}<br>"
                           "%{x:.3s} B: %{y:.3f} ms<extra>α-β model</extra>")),
            row=1, col=col)
    return fig


def bus_bandwidth(table: Any, *, collective: str | None = None, peak: float | None = None,
                  title: str | None = None) -> go.Figure:
    """Bus bandwidth (GB/s) against size, one panel per world size p, one colour per algorithm.

    nccl-tests (doc/PERFORMANCE.md): algbw = n / t; busbw = algbw × factor, 2(p−1)/p for
    all-reduce (`toolkit.cost.BUS_FACTOR`), so a bandwidth-bound ring all-reduce shows the link's
    speed whatever p is. Uses the table's ``busbw`` column, or computes it from ``seconds``.
    `peak` (bytes/s, e.g. ``fit.link.bandwidth``) draws a dashed line to compare against.
    """
    df, collective = _table(table, "bus_bandwidth", collective, [])
    if "busbw" not in df.columns:
        if "seconds" not in df.columns:
            raise ValueError("bus_bandwidth: the table needs a busbw or a seconds column")
        df = df.assign(busbw=[float(cost.busbw(collective, n, s, int(p)))
                              for n, s, p in zip(df.nbytes, df.seconds, df.p)])
    if peak is not None and not (peak > 0 and math.isfinite(peak)):
        raise ValueError(f"bus_bandwidth(peak={peak!r}) must be a positive, finite bytes/s")
    ps = sorted(int(p) for p in set(df.p))
    fig = _panels(ps, df.nbytes, y_title="bus bandwidth (GB/s)", y_log=False, title=title or (
        f"{collective}: bus bandwidth = n / t × {_factor_text(collective)}"))
    extra: dict[str, str] = {}
    for col, p, alg, rows in _series(df, ps):
        fig.add_trace(go.Scatter(
            x=rows.nbytes, y=rows.busbw / 1e9, mode="lines+markers", name=alg,
            legendgroup=alg, showlegend=col == 1, line=dict(color=_color(alg, extra)),
            customdata=[human_bytes(n) for n in rows.nbytes],
            hovertemplate=(f"<b>{alg}</b>, p={p}<br>%{{customdata}}: %{{y:.2f}} GB/s"
                           "<extra></extra>")),
            row=1, col=col)
    for col in range(1, len(ps) + 1) if peak is not None else ():
        label = dict(annotation_text=f"{peak / 1e9:.3g} GB/s",
                     annotation_position="top left") if col == 1 else {}
        fig.add_hline(y=peak / 1e9, line=dict(color="black", dash="dash", width=1),
                      row=1, col=col, **label)
    return fig


def _factor_text(collective: str) -> str:
    return {"all_reduce": "2(p−1)/p", "broadcast": "1", "reduce": "1"}.get(collective, "(p−1)/p")


def predicted_times(p: int, link: AlphaBeta,
                    nbytes_range: tuple[float, float] = (1 << 10, 1 << 30),
                    algorithms: Sequence[str] | None = None, *, collective: str = "all_reduce",
                    mark: float | None = None, title: str | None = None) -> go.Figure:
    """The α-β model's time per call against size (log-log) for each algorithm on p ranks.

    t = a(p)·α + b(p)·n·β with `link`'s α and β (`toolkit.cost.predict`). Black diamonds mark
    `switch_points`: the sizes where the fastest algorithm changes. Algorithms with the same
    model (ring and sharded PS) draw on top of each other; the legend says so. `mark` (bytes)
    draws a vertical line there, labelled with the fastest algorithm. Times in ms.
    """
    check_p_link(p, link, "predicted_times")
    algorithms = check_algorithms(collective, algorithms, "predicted_times")
    lo, hi = (float(x) for x in nbytes_range)
    if not 0 < lo < hi:
        raise ValueError(f"predicted_times(nbytes_range={nbytes_range!r}) must be (low, high) "
                         "with 0 < low < high bytes")
    grid = np.geomspace(lo, hi, 121)
    fig = go.Figure()
    extra: dict[str, str] = {}
    seen: dict[tuple[float, float], str] = {}
    for alg in algorithms:
        coef = cost.coefficients(collective, alg, p)
        same = seen.setdefault(coef, alg)
        a, b = coef
        fig.add_trace(go.Scatter(
            x=grid, y=cost.predict(collective, alg, grid, p, link) * _MS, mode="lines",
            name=alg if same == alg else f"{alg} (same model as {same})",
            line=dict(color=_color(alg, extra), dash="solid" if same == alg else "dash", width=2.5),
            hovertemplate=(f"<b>{alg}</b>: {a:g}·α + {b:.4g}·n·β<br>"
                           "n = %{x:.3s} B: %{y:.4g} ms<extra></extra>")))
    switches = switch_points(p, link, (lo, hi), algorithms, collective=collective)
    if switches:
        n_star = [n for n, _, _ in switches]
        y = [min(float(cost.predict(collective, a, n, p, link)) for a in algorithms) * _MS
             for n in n_star]
        fig.add_trace(go.Scatter(
            x=n_star, y=y, mode="markers+text", name="fastest changes",
            marker=dict(symbol="diamond", size=11, color="black"),
            text=[human_bytes(n) for n in n_star], textposition="top center",
            customdata=[[below, above, human_bytes(n)] for n, below, above in switches],
            hovertemplate=("%{customdata[0]} fastest below %{customdata[2]}, "
                           "%{customdata[1]} above<extra></extra>")))
    if mark is not None:
        if not lo <= mark <= hi:
            raise ValueError(f"predicted_times(mark={mark!r}) lies outside nbytes_range "
                             f"({human_bytes(lo)} … {human_bytes(hi)})")
        best, _ = fastest(p, link, mark, algorithms, collective=collective)
        fig.add_vline(x=mark, line=dict(color="black", dash="dot", width=1))
        # Placed by hand: add_vline's own label lands at 10^mark on a log axis
        # (plotly.py issue 4012); annotations on log axes take log10 coordinates.
        fig.add_annotation(x=math.log10(mark), y=1, xref="x", yref="paper", yanchor="bottom",
                           text=f"n = {human_bytes(mark)}: {best} fastest", showarrow=False)
    fig.update_xaxes(**_size_axis(lo, hi))
    fig.update_yaxes(title_text="predicted time per call (ms)", **_LOG_TIME)
    fig.update_layout(
        title=title or f"α-β model, {collective} on p = {p} ranks ({link})",
        height=440, legend_title_text="algorithm", margin=dict(l=70, r=20, t=80, b=50))
    return fig


def cost_terms(link: AlphaBeta, nbytes: float, ps: Sequence[int], *,
               collective: str = "all_reduce", algorithm: str = "ring", share: bool = False,
               title: str | None = None) -> go.Figure:
    """The model's two terms for one algorithm as p grows, stacked: latency a(p)·α and
    bandwidth b(p)·n·β (ms), at n = `nbytes`; with `share`, as percentages of the total. For the
    ring the first grows as 2(p−1)α while the second levels off at 2nβ, so at large enough p
    every message is latency-bound (above p ≈ nβ/α)."""
    if not ps:
        raise ValueError("cost_terms: ps must list at least one world size")
    for p in ps:
        check_p_link(p, link, "cost_terms")
    check_algorithms(collective, [algorithm], "cost_terms")
    if not nbytes > 0:
        raise ValueError(f"cost_terms(nbytes={nbytes!r}) must be > 0")
    ps = sorted(int(p) for p in ps)
    coef = [cost.coefficients(collective, algorithm, p) for p in ps]
    lat = [a * link.alpha * _MS for a, _ in coef]
    bw = [b * nbytes * link.beta * _MS for _, b in coef]
    labels = [str(p) for p in ps]
    share = [f"{la / (la + b):.0%}" if la + b > 0 else "—" for la, b in zip(lat, bw)]
    fig = go.Figure([
        go.Bar(x=labels, y=lat, name="latency a(p)·α", marker_color="#9467bd", customdata=share,
               hovertemplate=("p=%{x}: %{y:.4g} ms (%{customdata} of the total)"
                              "<extra>latency</extra>")),
        go.Bar(x=labels, y=bw, name="bandwidth b(p)·n·β", marker_color="#17becf",
               hovertemplate="p=%{x}: %{y:.4g} ms<extra>bandwidth</extra>"),
    ])
    fig.update_layout(
        barmode="stack", barnorm="percent" if share else None, height=400,
        legend_title_text="term",
        title=title or (f"{algorithm} {collective} of {human_bytes(nbytes)}: "
                        f"where the time goes ({link})"),
        xaxis=dict(title="world size p", type="category"),
        yaxis=dict(title="share of the predicted time (%)" if share
                   else "predicted time per call (ms)"),
        margin=dict(l=70, r=20, t=70, b=50))
    return fig


def traffic_and_rounds(ps: Sequence[int], algorithms: Sequence[str] | None = None, *,
                       collective: str = "all_reduce", recorded: Any = None,
                       title: str | None = None) -> go.Figure:
    """Two panels against p (log-log): bytes the busiest rank sends, as a multiple of n
    (`toolkit.cost.bytes_sent_per_rank`), and the rounds a(p): messages in sequence, each
    costing α. Ring: 2(p−1)/p·n (under 2n for any p) in 2(p−1) rounds.

    `recorded`: optional DataFrame of real runs with columns algorithm, p, nbytes, bytes_sent
    (the busiest rank's, from `toolkit.comm`'s totals), drawn as open circles on the left.
    """
    algorithms = check_algorithms(collective, algorithms, "traffic_and_rounds")
    ps = sorted({int(p) for p in ps})
    if not ps or ps[0] < 2:
        raise ValueError(f"traffic_and_rounds(ps={list(ps)}): list world sizes >= 2")
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1, subplot_titles=[
        "bytes sent by the busiest rank (× n)", "rounds a(p): messages in sequence"])
    extra: dict[str, str] = {}
    for alg in algorithms:
        color = _color(alg, extra)
        sent = [cost.bytes_sent_per_rank(collective, alg, 1.0, p) for p in ps]
        rounds = [cost.coefficients(collective, alg, p)[0] for p in ps]
        fig.add_trace(go.Scatter(x=ps, y=sent, mode="lines", name=alg, legendgroup=alg,
                                 line=dict(color=color),
                                 hovertemplate=(f"<b>{alg}</b> p=%{{x}}: %{{y:.4g}}·n"
                                                "<extra>model</extra>")),
                      row=1, col=1)
        fig.add_trace(go.Scatter(x=ps, y=rounds, mode="lines", name=alg, legendgroup=alg,
                                 showlegend=False, line=dict(color=color),
                                 hovertemplate=(f"<b>{alg}</b> p=%{{x}}: %{{y}} rounds"
                                                "<extra></extra>")),
                      row=1, col=2)
    if recorded is not None:
        need = {"algorithm", "p", "nbytes", "bytes_sent"}
        if not hasattr(recorded, "columns") or need - set(recorded.columns):
            raise ValueError(f"traffic_and_rounds(recorded=...) must be a DataFrame with columns "
                             f"{sorted(need)}")
        for alg, rows in recorded.groupby("algorithm", sort=False):
            fig.add_trace(go.Scatter(
                x=rows.p, y=rows.bytes_sent / rows.nbytes, mode="markers",
                name=f"{alg} (recorded)", legendgroup=alg,
                marker=dict(symbol="circle-open", size=12, line_width=2, color=_color(alg, extra)),
                hovertemplate=f"<b>{alg}</b> recorded, p=%{{x}}: %{{y:.4g}}·n<extra></extra>"),
                row=1, col=1)
    fig.update_xaxes(type="log", title_text="world size p",
                     **(dict(tickvals=ps) if len(ps) <= 12 else {}))
    fig.update_yaxes(type="log", dtick=1, tickformat=",~r")
    fig.update_layout(title=title or f"{collective}: traffic and rounds per rank as p grows",
                      height=420, legend_title_text="algorithm",
                      margin=dict(l=60, r=20, t=80, b=50))
    return fig
