"""Lesson 12's explorer: when do a layer's tensor-parallel all-reduces cost more than its compute?

    from toolkit.widgets.tensor_parallel import tp_explorer
    tp_explorer()                 # last line of a cell: sliders for h, tp, tokens, bandwidth

A thin shell over the pure view `toolkit.viz.tensor_parallel.tp_time_view` (the α-β time of
the four ring all-reduces of one layer against its compute per rank, over link bandwidths from
1 to 1000 GB/s, with a sentence of verdict). The explorer holds the sliders and, on every
change, puts that view into its `Output` area, as `toolkit.widgets.cost` does; its `figure`
attribute is the figure last drawn.
"""

from __future__ import annotations

import ipywidgets as W
import plotly.graph_objects as go

from ..viz.tensor_parallel import tp_time_view
from .base import SliderExplorer

__all__ = ["BANDWIDTH_GBS", "HIDDEN_CHOICES", "TOKEN_CHOICES", "TP_CHOICES", "TPExplorer",
           "tp_explorer"]

HIDDEN_CHOICES = (1024, 2048, 4096, 8192, 12288, 16384)
"""Hidden sizes h offered: GPT-2 medium (1024) to beyond GPT-3 (12288)."""
TP_CHOICES = (1, 2, 4, 8, 16, 32)
"""Tensor-parallel degrees offered (8 is one NVLink server)."""
TOKEN_CHOICES = tuple(2 ** k for k in range(9, 18))
"""Tokens per step on one rank, b·s: 512 … 131072."""
BANDWIDTH_GBS = (1.0, 1000.0)
"""Link bandwidth slider range, GB/s per direction (the view's x axis)."""


def _pick(value: int, choices: tuple[int, ...], name: str) -> int:
    if value not in choices:
        raise ValueError(f"tp_explorer: {name} must be one of {choices}, got {value!r}")
    return value


class TPExplorer(SliderExplorer):
    """Sliders for h, tp, tokens and link bandwidth over `tp_time_view`.

    Attributes: the sliders `hidden`, `tp`, `tokens`, `bandwidth_gbs`; `fixed` (the view's
    other arguments), and `SliderExplorer`'s `verdict`, `output`, `widget`, `figure`. Setting a
    slider's ``.value`` in code redraws as dragging it does.
    """

    def __init__(self, *, hidden: int, tp: int, tokens: int, bandwidth_gbs: float, seq: int,
                 alpha_us: float, peak_flops: float, efficiency: float) -> None:
        self.fixed = dict(seq=seq, alpha_us=alpha_us, peak_flops=peak_flops,
                          efficiency=efficiency)
        slow = dict(continuous_update=False, style={"description_width": "80px"})
        super().__init__(
            self._view, rows=[["hidden", "tp"], ["tokens", "bandwidth_gbs"]],
            hidden=W.SelectionSlider(options=HIDDEN_CHOICES, value=hidden,
                                     description="hidden h", **slow),
            tp=W.SelectionSlider(options=TP_CHOICES, value=tp, description="tp", **slow),
            tokens=W.SelectionSlider(options=TOKEN_CHOICES, value=tokens,
                                     description="tokens b·s", **slow),
            bandwidth_gbs=W.FloatLogSlider(
                value=min(max(bandwidth_gbs, BANDWIDTH_GBS[0]), BANDWIDTH_GBS[1]), base=10,
                min=0, max=3, step=0.05, readout_format=".3g", description="GB/s", **slow))

    def _view(self, **values: float) -> tuple[go.Figure, str]:
        return tp_time_view(**values, **self.fixed)


def tp_explorer(*, hidden: int = 12288, tp: int = 8, tokens: int = 2048,
                bandwidth_gbs: float = 50.0, seq: int = 2048, alpha_us: float = 10.0,
                peak_flops: float = 989e12, efficiency: float = 0.5) -> TPExplorer:
    """The explorer of lesson 12, starting at a GPT-3-sized layer (h = 12288) on tp = 8 over
    InfiniBand-class bandwidth; `seq`, α, the peak (H100 bf16) and the efficiency stay fixed.
    `hidden`, `tp` and `tokens` must be among the sliders' choices."""
    return TPExplorer(hidden=_pick(hidden, HIDDEN_CHOICES, "hidden"),
                      tp=_pick(tp, TP_CHOICES, "tp"),
                      tokens=_pick(tokens, TOKEN_CHOICES, "tokens"),
                      bandwidth_gbs=bandwidth_gbs, seq=seq, alpha_us=alpha_us,
                      peak_flops=peak_flops, efficiency=efficiency)
