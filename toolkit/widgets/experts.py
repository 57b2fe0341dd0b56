"""Lesson 13's explorer: capacity factor × router imbalance → dropped tokens, padding and the
all-to-all bytes of an MoE layer.

    from toolkit.widgets.experts import capacity_explorer
    capacity_explorer()        # last line of a cell: sliders for cf, imbalance, E, k

A thin shell over the pure view `toolkit.viz.experts.capacity_view` (tested without a browser);
`SliderExplorer` holds the sliders and redraws on every change.
"""

from __future__ import annotations

import ipywidgets as W

from ..arguments import check_int
from ..viz.experts import capacity_view
from .base import SliderExplorer

__all__ = ["EXPERT_CHOICES", "capacity_explorer"]

EXPERT_CHOICES = (8, 16, 32, 64, 128)
"""Experts per layer offered: Mixtral's 8 to Switch-Base's 128."""


def capacity_explorer(*, capacity_factor: float = 1.25, imbalance: float = 1.5,
                      num_experts: int = 8, top_k: int = 2, tokens: int = 4096,
                      hidden: int = 4096, ep: int = 8) -> SliderExplorer:
    """The explorer, ready to show. `tokens` per rank, `hidden` h and `ep` stay fixed (ep is
    capped at E); cf from 0.5 to 4, imbalance from 1 to 4 (the busiest expert's load over the
    mean), E among `EXPERT_CHOICES`, k from 1 to 4."""
    if num_experts not in EXPERT_CHOICES:
        raise ValueError(f"capacity_explorer: num_experts must be one of {EXPERT_CHOICES}, "
                         f"got {num_experts!r}")
    check_int("capacity_explorer", "top_k", top_k, high=4)
    check_int("capacity_explorer", "ep", ep, high=min(EXPERT_CHOICES))

    def view(**values: float) -> tuple:
        return capacity_view(**values, tokens=tokens, hidden=hidden, ep=ep)

    slow = dict(continuous_update=False, style={"description_width": "110px"})
    return SliderExplorer(
        view, rows=[["capacity_factor", "imbalance"], ["num_experts", "top_k"]],
        capacity_factor=W.FloatSlider(value=capacity_factor, min=0.5, max=4.0, step=0.05,
                                      description="capacity factor", **slow),
        imbalance=W.FloatSlider(value=imbalance, min=1.0, max=4.0, step=0.1,
                                description="max/mean load", **slow),
        num_experts=W.SelectionSlider(options=EXPERT_CHOICES, value=num_experts,
                                      description="experts E", **slow),
        top_k=W.IntSlider(value=top_k, min=1, max=4, description="top-k", **slow))
