"""The roofline explorer (lesson 06): a TinyGPT layer, a micro-batch size, a sequence length and
a precision → the layer's arithmetic intensity on this machine's measured roof and on the
datasheet GPUs' (A100, H100 SXM, bf16).

    from toolkit.widgets.roofline import roofline_explorer
    roofline_explorer(cfg, here=roof)        # last line of a cell; roof from measure_roof()

A thin shell: `toolkit.viz.roofline.roofline_view` maps the values to (figure, verdict) and is
tested without a browser; `SliderExplorer` holds the controls and redraws.
"""

from __future__ import annotations

import functools

import ipywidgets as W

from ..models import GPTConfig
from ..roofline import Roof
from ..viz.roofline import LAYERS, roofline_view
from .base import SliderExplorer

MICRO_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
"""Micro-batch sizes offered."""
SEQ_CHOICES = (16, 64, 256, 1024, 4096)
"""Sequence lengths offered (cfg.seq_len is added)."""


def roofline_explorer(cfg: GPTConfig, *, here: Roof, layer: str = "up_proj",
                      micro_batch: int = 1, bytes_per_element: int = 4) -> SliderExplorer:
    """The explorer, ready to show (end a cell with it). `here`: this machine's measured roof."""
    if layer not in LAYERS:
        raise ValueError(f"roofline_explorer: layer must be one of {list(LAYERS)}, got {layer!r}")
    if micro_batch not in MICRO_BATCHES:
        raise ValueError(f"roofline_explorer: micro_batch must be one of {MICRO_BATCHES}, got "
                         f"{micro_batch!r}")
    style = {"description_width": "110px"}
    view = functools.partial(roofline_view, cfg=cfg, here=here)
    return SliderExplorer(
        view, rows=[["layer", "bytes_per_element"], ["micro_batch", "seq_len"]],
        layer=W.Dropdown(options=list(LAYERS), value=layer, description="layer", style=style),
        bytes_per_element=W.Dropdown(options=[("fp32 (4 bytes)", 4), ("bf16 (2 bytes)", 2)],
                                     value=bytes_per_element, description="precision",
                                     style=style),
        micro_batch=W.SelectionSlider(options=MICRO_BATCHES, value=micro_batch,
                                      description="micro-batch", style=style),
        seq_len=W.SelectionSlider(options=sorted({*SEQ_CHOICES, cfg.seq_len}),
                                  value=cfg.seq_len, description="sequence s", style=style))


__all__ = ["MICRO_BATCHES", "SEQ_CHOICES", "roofline_explorer"]
