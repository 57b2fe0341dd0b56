"""Lesson 05's explorers.

The loss-scale explorer: a format, a loss scale and a shift of the gradients'
magnitudes in, the fraction of gradients flushed to zero, kept as subnormals, kept whole, or
overflowing out, over a histogram.

The amax-history explorer: a tensor's amax per step (recorded in a real run) replayed under
Transformer Engine's delayed scaling (`toolkit.precision.fp8.delayed_scales`) for a history
length, margin and algorithm: how many steps overflow, how much of the range goes unused.

    from toolkit.widgets.precision import loss_scale_explorer
    loss_scale_explorer(gradients)        # last line of a cell: sliders, a verdict, a figure

`gradients` is any sample of magnitudes (lesson 05 passes a real TinyGPT backward's). The
shift multiplies them by 10^k, standing for smaller gradients (a larger batch averaged, k
micro-batches of accumulation at 1/k each, a deeper model) or larger ones. A thin shell:
`loss_scale_view` maps the controls to (figure, verdict) and is tested without a browser.
"""

from __future__ import annotations

import math

import ipywidgets as W
import plotly.graph_objects as go
import torch

from ..formats import FORMATS, format_info, survival
from ..precision.fp8 import FP8, DelayedScaling, delayed_scales
from ..viz.precision import amax_history, survival_histogram
from .base import SLOW, SliderExplorer


def loss_scale_view(*, magnitudes: torch.Tensor, fmt: str = "fp16", log2_scale: int = 0,
                    shift: float = 0.0) -> tuple[go.Figure, str]:
    """(histogram of log2(|g|·10^shift·2^log2_scale) over `fmt`'s bands, HTML verdict)."""
    if fmt not in FORMATS:
        raise ValueError(f"loss_scale_view: fmt must be one of {list(FORMATS)}, got {fmt!r}")
    g = magnitudes.detach().double().abs().reshape(-1) * 10.0 ** shift
    scale = 2.0 ** log2_scale
    f = format_info(fmt)
    share = survival(g * scale, fmt)
    fig = survival_histogram(g, f, scale=scale,
                             title=f"{fmt}: gradients × 10^{shift:g}, loss scale 2^{log2_scale}")
    verdict = (f"<b>{fmt}</b>, scale 2^{log2_scale}: <b style='color:#d62728'>"
               f"{share['zero']:.2%}</b> flushed to zero, {share['subnormal']:.2%} subnormal "
               f"(fewer than {f.mantissa_bits + 1} significant bits), "
               f"<b style='color:#9467bd'>{share['overflow']:.2%}</b> overflow")
    if share["overflow"] > 0:
        verdict += ": a dynamic scaler skips this step and halves the scale."
    elif share["zero"] > 0:
        verdict += ": a larger scale would keep them."
    elif share["subnormal"] > 0:
        verdict += ": none lost, some imprecise; a larger scale gives them full precision."
    else:
        verdict += ": every value kept with full precision."
    return fig, verdict


class LossScaleExplorer(SliderExplorer):
    """Controls over `loss_scale_view`: `fmt`, `log2_scale`, `shift` (and `SliderExplorer`'s
    `verdict`, `output`, `widget`, `figure`)."""

    def __init__(self, magnitudes: torch.Tensor, *, fmt: str, log2_scale: int,
                 shift: float) -> None:
        self.magnitudes = magnitudes.detach().double().abs().reshape(-1)
        style = {"description_width": "110px"}
        super().__init__(
            lambda **v: loss_scale_view(magnitudes=self.magnitudes, **v),
            rows=[["fmt", "log2_scale"], ["shift"]],
            fmt=W.Dropdown(options=list(FORMATS), value=fmt, description="format",
                           style=style),
            log2_scale=W.IntSlider(value=log2_scale, min=-8, max=40, description="log2 scale",
                                   style=style, **SLOW),
            shift=W.FloatSlider(value=shift, min=-6, max=2, step=0.5,
                                description="gradients × 10^", style=style, **SLOW))


def loss_scale_explorer(magnitudes: torch.Tensor, *, fmt: str = "fp16", log2_scale: int = 0,
                        shift: float = 0.0) -> LossScaleExplorer:
    """The explorer over a sample of gradient magnitudes, starting from `fmt` (a key of
    `toolkit.formats.FORMATS`), loss scale 2^`log2_scale` and shift 10^`shift`."""
    if fmt not in FORMATS:
        raise ValueError(f"loss_scale_explorer: fmt must be one of {list(FORMATS)}, got {fmt!r}")
    if magnitudes.numel() == 0:
        raise ValueError("loss_scale_explorer: magnitudes is empty")
    return LossScaleExplorer(magnitudes, fmt=fmt, log2_scale=log2_scale, shift=shift)


def amax_history_view(*, amaxes: list[float], fmt: str = "fp8 e5m2", history_len: int = 16,
                      margin: int = 0, algo: str = "max") -> tuple[go.Figure, str]:
    """(amaxes against the range of each step's delayed scale, HTML verdict)."""
    recipe = DelayedScaling(fmt=fmt, margin=margin, amax_history_len=history_len,
                            amax_compute_algo=algo)
    scales = delayed_scales(amaxes, recipe)
    f = format_info(fmt)
    # Step 0 has no history (scale 1): judged from step 1 on, as a run's steady state.
    later = range(1, len(amaxes))
    over = [t for t in later if amaxes[t] * scales[t] > f.max]
    unused = [math.log2(f.max / (amaxes[t] * scales[t])) for t in later
              if t not in over and amaxes[t] > 0]
    fig = amax_history(amaxes, scales, f, title=(f"{fmt}, history {history_len}, "
                                                 f"margin {margin}, {algo}"))
    mean_unused = sum(unused) / len(unused) if unused else 0.0
    verdict = (f"<b style='color:#9467bd'>{len(over)}</b> of {len(later)} steps overflow (the "
               f"amax outgrew the delayed scale: the top values saturate); on the others "
               f"<b>{mean_unused:.1f}</b> powers of two at the top go unused on average, and "
               f"as many are lost at the bottom, where small values flush to 0.")
    return fig, verdict


class AmaxHistoryExplorer(SliderExplorer):
    """Controls over `amax_history_view`: `history_len`, `margin`, `algo` (and
    `SliderExplorer`'s `verdict`, `output`, `widget`, `figure`)."""

    def __init__(self, amaxes: list[float], *, fmt: str, history_len: int, margin: int,
                 algo: str) -> None:
        self.amaxes, self.fmt = list(amaxes), fmt
        style = {"description_width": "110px"}
        super().__init__(
            lambda **v: amax_history_view(amaxes=self.amaxes, fmt=self.fmt, **v),
            rows=[["history_len", "margin"], ["algo"]],
            history_len=W.IntSlider(value=history_len, min=1, max=max(1, len(self.amaxes)),
                                    description="amax history", style=style, **SLOW),
            margin=W.IntSlider(value=margin, min=0, max=4, description="margin", style=style,
                               **SLOW),
            algo=W.Dropdown(options=["max", "most_recent"], value=algo, description="algorithm",
                            style=style))


def amax_history_explorer(amaxes: list[float], *, fmt: str = "fp8 e5m2", history_len: int = 16,
                          margin: int = 0, algo: str = "max") -> AmaxHistoryExplorer:
    """The explorer over a recorded amax per step (at least 2 steps), in the fp8 format `fmt`."""
    if fmt not in FP8:
        raise ValueError(f"amax_history_explorer: fmt must be one of {list(FP8)}, got {fmt!r}")
    if len(amaxes) < 2:
        raise ValueError(f"amax_history_explorer: need the amaxes of at least 2 steps, got "
                         f"{len(amaxes)}")
    return AmaxHistoryExplorer(amaxes, fmt=fmt, history_len=history_len, margin=margin,
                               algo=algo)


__all__ = ["AmaxHistoryExplorer", "LossScaleExplorer", "amax_history_explorer",
           "amax_history_view", "loss_scale_explorer", "loss_scale_view"]
