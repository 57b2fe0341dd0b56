"""What every explorer shares: showing figures and tables inside an ipywidgets `Output`.

Explorers replace an `Output`'s content by assigning its ``outputs`` (`show_in`), never with
``with area: clear_output(); display(...)``: that form routes the kernel's messages through the
widget's captured message id, which JupyterLab handles but nbclient (``jupyter nbconvert
--execute``, papermill, `benchmarks/lesson_resources.py`) does not: it then waits out its whole
cell timeout on the next cell (seen here: 30 s of every 30 s timeout after lesson 02's explorer).
"""

from __future__ import annotations

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


__all__ = ["plotly_bundle", "show_in"]
