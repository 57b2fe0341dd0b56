"""The recomputation explorer (lesson 14): a model, a sequence length and a micro-batch →
activation memory against extra FLOPs for none, flash-style attention, selective recomputation
and full recomputation in segments of every length k.

    from toolkit.widgets.recompute import recompute_explorer
    recompute_explorer("gpt3-175b", seq_len=2048, batch=1)   # last line of a cell

A thin shell: `toolkit.viz.recompute.recompute_view` maps the values to (figure, verdict) and
is tested without a browser; `SliderExplorer` holds the controls and redraws.
"""

from __future__ import annotations

import ipywidgets as W

from ..memory import MODELS
from ..viz.recompute import recompute_view
from .base import SliderExplorer

SEQ_CHOICES = (512, 1024, 2048, 4096, 8192, 16384, 32768)
"""Sequence lengths offered."""


def recompute_explorer(model: str = "gpt3-175b", *, seq_len: int = 2048,
                       batch: int = 1) -> SliderExplorer:
    """The explorer, ready to show (end a cell with it)."""
    if model not in MODELS:
        raise ValueError(f"recompute_explorer: model must be one of {sorted(MODELS)}, "
                         f"got {model!r}")
    slow = dict(continuous_update=False, style={"description_width": "80px"})
    options = sorted({*SEQ_CHOICES, seq_len})
    return SliderExplorer(
        recompute_view,
        model=W.Dropdown(options=sorted(MODELS), value=model, description="model",
                         style=slow["style"]),
        seq_len=W.SelectionSlider(options=options, value=seq_len, description="sequence s",
                                  **slow),
        batch=W.IntSlider(value=batch, min=1, max=16, description="micro-batch b", **slow))


__all__ = ["SEQ_CHOICES", "recompute_explorer"]
