"""What every explorer shares: `SliderExplorer` (controls wired to a view function), and showing
figures and tables inside an ipywidgets `Output`.

    explorer = SliderExplorer(view, cap_kb=W.SelectionSlider(options=[16, 64, 256]))
    explorer            # last line of a cell: the controls, a sentence, the figure

``view(**control_values)`` returns ``(figure, html)``; it holds all the logic, so it is tested
without a browser. The explorer only wires the controls to it: any control's change (dragging,
or setting ``.value`` in code) calls the view again and replaces the figure. The topic explorers
(`CostExplorer`, `MemoryExplorer`, ...) are `SliderExplorer`s with their controls and layout.

Explorers replace an `Output`'s content by assigning its ``outputs`` (`show_in`), never with
``with area: clear_output(); display(...)``: that form routes the kernel's messages through the
widget's captured message id, which JupyterLab handles but nbclient (``jupyter nbconvert
--execute``, papermill, `benchmarks/lesson_resources.py`) does not: it then waits out its whole
cell timeout on the next cell (seen here: 30 s of every 30 s timeout after lesson 02's explorer).
"""

from __future__ import annotations

from typing import Callable, Sequence

import ipywidgets as W
import plotly.graph_objects as go
import plotly.io as pio


def plotly_bundle(fig: go.Figure) -> dict:
    """The figure as a display mime bundle: plotly's JSON mimetype (drawn by JupyterLab's
    jupyterlab-plotly extension) and a line of text for plain consoles."""
    bundle = dict(pio.renderers["plotly_mimetype"].to_mimebundle(fig.to_dict()))
    bundle["text/plain"] = f"<plotly figure: {fig.layout.title.text or 'untitled'}>"
    return bundle


def show_in(area, *objects) -> None:
    """Show `objects` (plotly figures, DataFrames, anything IPython can display) in the
    ipywidgets `Output` `area`, replacing what it showed, in one step."""
    from IPython.core.formatters import format_display_data

    outputs = []
    for obj in objects:
        if isinstance(obj, go.Figure):
            data, metadata = plotly_bundle(obj), {}
        else:
            data, metadata = format_display_data(obj)
        outputs.append({"output_type": "display_data", "data": data, "metadata": metadata})
    area.outputs = tuple(outputs)


View = Callable[..., tuple[go.Figure, str]]
SLOW = dict(continuous_update=False)
"""Slider keywords for a slow view: dragging redraws once, on release."""


class SliderExplorer:
    """Controls (keyword arguments: name → ipywidgets control) over ``view(**values)``.

    Attributes: each control under its name (``explorer.p``), `controls` (name → control),
    `verdict` (HTML), `output` (the figure's area), `widget` (the whole box), `figure` (the
    figure last drawn). `rows` lays the controls out, one HBox per list of names (default: one
    row); `extra` widgets go between the verdict and the figure. Controls should use
    ``continuous_update=False`` (`SLOW`) when the view is slow (a rerun on ranks).
    """

    def __init__(self, view: View, *, rows: Sequence[Sequence[str]] | None = None,
                 extra: Sequence[W.Widget] = (), **controls: W.ValueWidget) -> None:
        if not callable(view):
            raise TypeError(f"SliderExplorer(view=...) must be callable, got {type(view).__name__}")
        if not controls:
            raise ValueError("SliderExplorer needs at least one control (name=ipywidgets slider)")
        self.view = view
        self.controls = dict(controls)
        self.verdict = W.HTML()
        self.output = W.Output()
        self.figure: go.Figure | None = None
        for name, control in self.controls.items():
            if hasattr(self, name):
                raise ValueError(f"SliderExplorer: a control may not be called {name!r} (the "
                                 f"explorer's own attribute); rename it")
            setattr(self, name, control)
        layout = [list(self.controls)] if rows is None else [list(row) for row in rows]
        placed = [name for row in layout for name in row]
        if sorted(placed) != sorted(self.controls):
            raise ValueError(f"SliderExplorer(rows=...) must place every control once: got "
                             f"{layout} for controls {list(self.controls)}")
        self.widget = W.VBox([W.HBox([self.controls[n] for n in row]) for row in layout]
                             + [self.verdict, *extra, self.output])
        for control in self.controls.values():
            control.observe(self.redraw, names="value")
        self.redraw()

    @property
    def values(self) -> dict:
        return {name: c.value for name, c in self.controls.items()}

    def redraw(self, change: object = None) -> None:
        """Call the view with the current values and replace the figure in place."""
        self.figure, self.verdict.value = self.view(**self.values)
        # Assigning `outputs` replaces the previous figure in one step (no flicker), and works
        # with or without a kernel, unlike `with output: display(...)`.
        show_in(self.output, self.figure)

    def _repr_mimebundle_(self, **kwargs: object) -> dict:
        return self.widget._repr_mimebundle_(**kwargs)


__all__ = ["SLOW", "SliderExplorer", "plotly_bundle", "show_in"]
