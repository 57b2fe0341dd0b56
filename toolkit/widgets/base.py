"""What every explorer shares: showing a plotly figure inside an ipywidgets `Output`."""

from __future__ import annotations

import plotly.graph_objects as go
import plotly.io as pio


def plotly_bundle(fig: go.Figure) -> dict:
    """The figure as a display mime bundle: plotly's JSON mimetype (drawn by JupyterLab's
    jupyterlab-plotly extension) and a line of text for plain consoles."""
    bundle = dict(pio.renderers["plotly_mimetype"].to_mimebundle(fig.to_dict()))
    bundle["text/plain"] = f"<plotly figure: {fig.layout.title.text or 'untitled'}>"
    return bundle


__all__ = ["plotly_bundle"]
