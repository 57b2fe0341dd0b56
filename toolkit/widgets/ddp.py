"""Lesson 04's explorers: sliders that call a view function and redraw the figure it returns.

    explorer = SliderExplorer(view, bucket_cap_kb=W.SelectionSlider(options=[16, 64, 256]))
    explorer            # last line of a cell: the sliders, a sentence, the figure

``view(**slider_values)`` returns ``(figure, html)``; it holds all the logic (for the bucket
explorer it reruns DDP on real ranks and draws `viz.ddp.overlap_timeline`; for staleness it runs
`viz.ddp.stale_sgd`), so it is tested without a browser. The explorer only wires sliders to it
and puts its figure into an `Output` as plotly's mimetype (`base.show_in`), as
`widgets.cost.CostExplorer` does.
"""

from __future__ import annotations

from typing import Callable

import ipywidgets as W
import plotly.graph_objects as go

from .base import show_in

__all__ = ["SliderExplorer"]


class SliderExplorer:
    """Sliders (keyword arguments: name → ipywidgets control) over ``view(**values)``.

    Attributes: `controls` (name → control), `verdict` (HTML), `output` (the figure's area),
    `widget` (the whole box), `figure` (the figure last drawn). Any control's change redraws;
    so does setting its ``.value`` in code. Controls should use ``continuous_update=False`` when
    the view is slow (a rerun on ranks), so that dragging redraws once, on release.
    """

    def __init__(self, view: Callable[..., tuple[go.Figure, str]], **controls: W.ValueWidget) -> None:
        if not callable(view):
            raise TypeError(f"SliderExplorer(view=...) must be callable, got {type(view).__name__}")
        if not controls:
            raise ValueError("SliderExplorer needs at least one control (name=ipywidgets slider)")
        self.view = view
        self.controls = dict(controls)
        self.verdict = W.HTML()
        self.output = W.Output()
        self.widget = W.VBox([W.HBox(list(self.controls.values())), self.verdict, self.output])
        self.figure: go.Figure | None = None
        for control in self.controls.values():
            control.observe(self.redraw, names="value")
        self.redraw()

    @property
    def values(self) -> dict:
        return {name: c.value for name, c in self.controls.items()}

    def redraw(self, change: object = None) -> None:
        """Call the view with the current values and replace the figure in place."""
        self.figure, self.verdict.value = self.view(**self.values)
        show_in(self.output, self.figure)

    def _repr_mimebundle_(self, **kwargs: object) -> dict:
        return self.widget._repr_mimebundle_(**kwargs)
