"""The α-β cost explorer: sliders for p, n, α and 1/β over `toolkit.cost`'s predictions.

    from toolkit import widgets
    widgets.cost_explorer(fit.link, p=64)    # last line of a cell: sliders, a verdict, a figure

The explorer is a thin shell. One pure function maps slider values to what is shown
(`cost_view`: a figure and a sentence) and is tested without a browser; the explorer object only
holds the sliders and, on every change, puts that function's output into its `Output` area
(the figure as plotly's JSON mimetype, which JupyterLab draws; plotly's FigureWidget would need
the anywidget package). Its `figure` attribute is the figure last drawn, for tests and for
reuse in a cell.
"""

from __future__ import annotations

import math
from typing import Sequence

import ipywidgets as W
import plotly.graph_objects as go

from .. import viz
from ..cost import AlphaBeta, Fit
from ..cost import fastest, human_bytes
from .base import SliderExplorer

P_CHOICES = tuple(2 ** k for k in range(1, 11))
"""World sizes the p slider offers: 2, 4, … 1024 (a log scale)."""
SIZE_CHOICES = tuple(2 ** k for k in range(10, 31))
"""Message sizes the n slider offers, bytes: 1 KiB, 2 KiB, … 1 GiB."""
DEFAULT_LINK = AlphaBeta(alpha=100e-6, beta=1e-9)
"""Roughly gloo between processes on one laptop: ~100 µs per message, ~1 GB/s."""
ALPHA_US = (0.1, 10_000.0)      # α slider range, µs (NVLink-class to a slow, busy network)
BANDWIDTH_GBS = (0.01, 1000.0)  # 1/β slider range, GB/s


def cost_view(*, p: int, nbytes: float, alpha_us: float, bandwidth_gbs: float,
              collective: str = "all_reduce", algorithms: Sequence[str] | None = None,
              nbytes_range: tuple[float, float] = (SIZE_CHOICES[0], SIZE_CHOICES[-1]),
              ) -> tuple[go.Figure, str]:
    """What the cost explorer shows for these slider values: (figure, HTML verdict).

    The figure is `viz.predicted_times` for a link with α = `alpha_us` µs and
    β = 1 / (`bandwidth_gbs` GB/s), with a line at n = `nbytes`; the verdict names the fastest
    algorithm at n and how much slower each other one is, by the same model.
    """
    if not (alpha_us >= 0 and bandwidth_gbs > 0):
        raise ValueError(f"cost_view: need α >= 0 µs and bandwidth > 0 GB/s, got {alpha_us}, "
                         f"{bandwidth_gbs}")
    link = AlphaBeta(alpha=alpha_us * 1e-6, beta=1.0 / (bandwidth_gbs * 1e9))
    fig = viz.predicted_times(p, link, nbytes_range, algorithms, collective=collective,
                              mark=nbytes)
    best, times = fastest(p, link, nbytes, algorithms, collective=collective)
    t_best = min(times.values())
    others = ", ".join(f"{a} {t / t_best:.3g}×"
                       for a, t in sorted(times.items(), key=lambda kv: kv[1])
                       if t > t_best * (1 + 1e-9))
    verdict = (f"<b>{human_bytes(nbytes)} on p = {p} ranks</b>: <b>{best}</b> is fastest, "
               f"{_seconds(t_best)}" + (f"; the others take {others} as long." if others else "."))
    return fig, verdict


def _seconds(t: float) -> str:
    return f"{t * 1e6:.3g} µs" if t < 1e-3 else f"{t * 1e3:.3g} ms" if t < 1 else f"{t:.3g} s"


def _nearest(value: float, choices: Sequence[int]) -> int:
    """The choice closest to `value` on a log scale (sliders offer powers of two)."""
    return min(choices, key=lambda c: abs(math.log(c) - math.log(max(value, 1e-300))))


def _clamp(value: float, bounds: tuple[float, float]) -> float:
    return min(max(value, bounds[0]), bounds[1])


class CostExplorer(SliderExplorer):
    """Sliders for p, n, α and 1/β over the α-β model's time per algorithm (`cost_view`).

    Attributes: the sliders `p`, `nbytes`, `alpha_us`, `bandwidth_gbs`, and `SliderExplorer`'s
    `verdict`, `output`, `widget`, `figure`. Shown by ending a cell with the explorer; setting a
    slider's ``.value`` in code redraws too.
    """

    def __init__(self, link: AlphaBeta, *, p: int, nbytes: int, collective: str,
                 algorithms: Sequence[str] | None) -> None:
        self.collective, self.algorithms = collective, algorithms
        slow = dict(continuous_update=False, style={"description_width": "70px"})
        super().__init__(
            self._view, rows=[["p", "nbytes"], ["alpha_us", "bandwidth_gbs"]],
            p=W.SelectionSlider(options=[(str(c), c) for c in P_CHOICES],
                                value=_nearest(p, P_CHOICES), description="ranks p", **slow),
            nbytes=W.SelectionSlider(options=[(human_bytes(c), c) for c in SIZE_CHOICES],
                                     value=_nearest(nbytes, SIZE_CHOICES),
                                     description="size n", **slow),
            alpha_us=W.FloatLogSlider(
                value=_clamp(link.alpha * 1e6, ALPHA_US), base=10, min=math.log10(ALPHA_US[0]),
                max=math.log10(ALPHA_US[1]), step=0.05, readout_format=".1f",
                description="α (µs)", **slow),
            bandwidth_gbs=W.FloatLogSlider(
                value=_clamp(link.bandwidth / 1e9, BANDWIDTH_GBS), base=10,
                min=math.log10(BANDWIDTH_GBS[0]), max=math.log10(BANDWIDTH_GBS[1]), step=0.05,
                readout_format=".2f", description="1/β (GB/s)", **slow))

    def _view(self, **values: float) -> tuple[go.Figure, str]:
        return cost_view(**values, collective=self.collective, algorithms=self.algorithms)


def cost_explorer(link: AlphaBeta | Fit | None = None, *, p: int = 64, nbytes: int = 1 << 20,
                  collective: str = "all_reduce",
                  algorithms: Sequence[str] | None = None) -> CostExplorer:
    """An explorer of the α-β model: sliders for p (2 … 1024), n (1 KiB … 1 GiB), α and 1/β,
    starting from `link` (e.g. a fit to this machine; default `DEFAULT_LINK`), redrawing the
    predicted time of each algorithm and naming the fastest. p and n snap to the nearest power
    of two; α and 1/β are clamped to the sliders' ranges."""
    if isinstance(link, Fit):
        link = link.link
    link = DEFAULT_LINK if link is None else link
    if not isinstance(link, AlphaBeta):
        raise TypeError(f"cost_explorer(link=...) must be an AlphaBeta or a Fit, "
                        f"got {type(link).__name__}")
    return CostExplorer(link, p=p, nbytes=nbytes, collective=collective, algorithms=algorithms)


__all__ = ["ALPHA_US", "BANDWIDTH_GBS", "DEFAULT_LINK", "P_CHOICES", "SIZE_CHOICES",
           "CostExplorer", "cost_explorer", "cost_view"]
