"""The loss-scale explorer (lesson 05): a format, a loss scale and a shift of the gradients'
magnitudes in, the fraction of gradients flushed to zero, kept as subnormals, kept whole, or
overflowing out, over a histogram.

    from toolkit.widgets.precision import loss_scale_explorer
    loss_scale_explorer(gradients)        # last line of a cell: sliders, a verdict, a figure

`gradients` is any sample of magnitudes (lesson 05 passes a real TinyGPT backward's). The
shift multiplies them by 10^k, standing for smaller gradients (a larger batch averaged, k
micro-batches of accumulation at 1/k each, a deeper model) or larger ones. A thin shell:
`loss_scale_view` maps the controls to (figure, verdict) and is tested without a browser.
"""

from __future__ import annotations

import ipywidgets as W
import plotly.graph_objects as go
import torch

from ..formats import FORMATS, format_info, survival
from ..viz.precision import survival_histogram
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


__all__ = ["LossScaleExplorer", "loss_scale_explorer", "loss_scale_view"]
