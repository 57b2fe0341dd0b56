"""ipywidgets drawn from their saved state (the widget-state JSON schema of ipywidgets 8:
https://ipywidgets.readthedocs.io, "Embedding Jupyter Widgets"), as disabled HTML controls.

A static page has no kernel, so a slider cannot redraw its figure; what the page shows is the
widget tree as the executed notebook left it: boxes, each control at its value, and an Output
widget's captured outputs (the explorer's figure) drawn by the page's own output renderer.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from typing import Any

BOXES = {"VBoxModel": "column", "BoxModel": "column", "HBoxModel": "row", "GridBoxModel": "row",
         "AccordionModel": "column", "TabModel": "column", "StackModel": "column"}
SLIDERS = {"IntSliderModel", "FloatSliderModel", "FloatLogSliderModel", "IntRangeSliderModel",
           "FloatRangeSliderModel", "SelectionSliderModel", "SelectionRangeSliderModel"}
CHOICES = {"DropdownModel", "ToggleButtonsModel", "RadioButtonsModel", "SelectModel"}


def _model_id(ref: str) -> str:
    return ref.removeprefix("IPY_MODEL_")


def _label(state: dict[str, Any]) -> str:
    text = state.get("description") or ""
    return f'<span class="widget-label">{html.escape(text)}</span>' if text else ""


def render_widget(model_id: str, models: dict[str, Any],
                  outputs: Callable[[list[dict[str, Any]]], str], depth: int = 0) -> str:
    """HTML for one widget and its children; unknown models show their value, if any."""
    model = models.get(model_id)
    if model is None or depth > 50:   # a reference the saved state does not hold; a cycle
        return ""
    name, state = model.get("model_name", ""), model.get("state", {})
    if name in BOXES:
        inner = "".join(render_widget(_model_id(c), models, outputs, depth + 1)
                        for c in state.get("children", []))
        return f'<div class="widget-box {BOXES[name]}">{inner}</div>'
    if name == "OutputModel":
        return f'<div class="widget-output">{outputs(state.get("outputs", []))}</div>'
    if name in SLIDERS:
        if "_options_labels" in state:
            labels = state["_options_labels"]
            index = state.get("index", 0)
            shown = (", ".join(labels[i] for i in index) if isinstance(index, list)
                     else labels[index] if 0 <= index < len(labels) else "")
            lo, hi, value = 0, max(len(labels) - 1, 0), index if isinstance(index, int) else 0
        else:
            value = state.get("value", 0)
            lo, hi = state.get("min", 0), state.get("max", 100)
            shown = f"{value:g}" if isinstance(value, (int, float)) else str(value)
            if name == "FloatLogSliderModel":  # min/max are exponents of `base`: so is the knob
                base = state.get("base", 10)
                shown = f"{value:.3g}"
                value = round(math.log(value, base), 6) if value > 0 else lo
            if isinstance(value, list):
                value = value[0]
        return (f'<label class="widget-slider">{_label(state)}<input type="range" disabled '
                f'min="{lo}" max="{hi}" value="{value}" step="any">'
                f"<output>{html.escape(shown)}</output></label>")
    if name in CHOICES:
        labels, index = state.get("_options_labels", []), state.get("index")
        opts = "".join(f'<option{" selected" if i == index else ""}>{html.escape(t)}</option>'
                       for i, t in enumerate(labels))
        return (f'<label class="widget-choice">{_label(state)}'
                f'<select disabled>{opts}</select></label>')
    if name in ("CheckboxModel", "ToggleButtonModel"):
        checked = " checked" if state.get("value") else ""
        return (f'<label class="widget-check"><input type="checkbox" disabled{checked}>'
                f'{_label(state)}</label>')
    if name in ("HTMLModel", "HTMLMathModel"):
        return f'<div class="widget-html">{state.get("value", "")}</div>'
    if name == "ButtonModel":
        return f'<button disabled>{html.escape(state.get("description", ""))}</button>'
    if "value" in state and not isinstance(state["value"], (dict, list)):
        return (f'<span class="widget-value">{_label(state)}'
                f'{html.escape(str(state["value"]))}</span>')
    return ""
