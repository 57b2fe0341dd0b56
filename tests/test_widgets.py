"""toolkit.widgets: the pure mapping from slider values to a view, and the explorer redrawing
when a slider's value changes (no browser, no kernel)."""

from __future__ import annotations

import json

import ipywidgets as W
import numpy as np
import pytest

from toolkit import cost, widgets

LINK = cost.AlphaBeta(alpha=100e-6, beta=1e-9)  # 100 µs, 1 GB/s
MIME = "application/vnd.plotly.v1+json"


def test_cost_view_draws_the_model_for_the_slider_values_and_names_the_fastest():
    fig, verdict = widgets.cost_view(p=64, nbytes=1 << 10, alpha_us=100, bandwidth_gbs=1)
    ring = next(t for t in fig.data if t.name == "ring")
    assert np.allclose(ring.y, cost.predict("all_reduce", "ring", np.array(ring.x), 64, LINK) * 1e3)
    assert ring.x[0] == pytest.approx(widgets.SIZE_CHOICES[0])
    assert ring.x[-1] == pytest.approx(widgets.SIZE_CHOICES[-1])
    assert fig.layout.shapes[0].x0 == 1024                    # the chosen size is marked
    # 1 KiB on 64 ranks: the tree's 12 rounds beat the ring's 126.
    assert "<b>tree</b> is fastest" in verdict and "1 KiB on p = 64 ranks" in verdict
    t_tree = float(cost.predict("all_reduce", "tree", 1024, 64, LINK))
    assert f"{t_tree * 1e3:.3g} ms" in verdict
    _, big = widgets.cost_view(p=64, nbytes=1 << 30, alpha_us=100, bandwidth_gbs=1)
    assert "<b>ring = sharded_ps</b> is fastest" in big and "ps " in big


def test_cost_view_rejects_impossible_links():
    with pytest.raises(ValueError, match="bandwidth > 0"):
        widgets.cost_view(p=4, nbytes=1024, alpha_us=1, bandwidth_gbs=0)


def current(explorer) -> dict:
    (out,) = explorer.output.outputs
    assert out["output_type"] == "display_data"
    json.dumps(out)                                     # must travel to the browser as JSON
    return out["data"][MIME]


def test_explorer_draws_at_once_and_redraws_when_a_slider_moves():
    ex = widgets.cost_explorer(LINK, p=64, nbytes=1 << 20)
    assert isinstance(ex.widget, W.VBox)
    assert ex.p.value == 64 and ex.nbytes.value == 1 << 20
    assert ex.alpha_us.value == pytest.approx(100) and ex.bandwidth_gbs.value == pytest.approx(1)
    first_title = ex.figure.layout.title.text
    assert current(ex)["layout"]["title"]["text"] == first_title and "p = 64" in first_title

    ex.p.value = 1024                                   # as if the student dragged the slider
    assert "p = 1024" in ex.figure.layout.title.text
    assert current(ex)["layout"]["title"]["text"] == ex.figure.layout.title.text
    assert "p = 1024 ranks" in ex.verdict.value and len(ex.output.outputs) == 1

    before = ex.verdict.value
    ex.alpha_us.value = 1.0                             # latency 100× smaller: the ring wins
    assert ex.verdict.value != before and "<b>ring = sharded_ps</b>" in ex.verdict.value
    ex.nbytes.value = 1 << 10
    assert "1 KiB: " in ex.figure.layout.annotations[0].text
    ex.bandwidth_gbs.value = 100.0
    assert "(100.00 GB/s)" in ex.figure.layout.title.text


def test_explorer_snaps_and_clamps_its_start_values_and_takes_a_fit():
    fit = cost.fit_alpha_beta([cost.Sample("all_reduce", "ring", 4, n,
                                           float(cost.predict("all_reduce", "ring", n, 4, LINK)))
                               for n in (1e4, 1e6)])
    ex = widgets.cost_explorer(fit, p=100, nbytes=3000)
    assert ex.p.value == 128 and ex.nbytes.value == 4096       # nearest power of two (log scale)
    assert ex.alpha_us.value == pytest.approx(100)
    fast = widgets.cost_explorer(cost.AlphaBeta(alpha=1e-9, beta=0.0))  # 1 ns, infinite bandwidth
    assert fast.alpha_us.value == pytest.approx(widgets.ALPHA_US[0])
    assert fast.bandwidth_gbs.value == pytest.approx(widgets.BANDWIDTH_GBS[1])
    few = widgets.cost_explorer(LINK, algorithms=["ring", "ps"])
    assert [t.name for t in few.figure.data] == ["ring", "ps"]
    with pytest.raises(TypeError, match="AlphaBeta or a Fit"):
        widgets.cost_explorer((1e-4, 1e-9))


def test_explorer_displays_as_its_widget_box():
    ex = widgets.cost_explorer()
    bundle = ex._repr_mimebundle_()
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == ex.widget.model_id
    assert widgets.plotly_bundle(ex.figure)["text/plain"].startswith("<plotly figure: α-β model")


def test_show_in_replaces_an_output_in_one_step():
    """Explorers fill an Output by assigning its outputs (no `with area:` capture, which
    nbclient mishandles): a figure as plotly's mimetype, a table as HTML, replaced each time."""
    import ipywidgets
    import pandas as pd
    import plotly.graph_objects as go

    area = ipywidgets.Output()
    widgets.show_in(area, go.Figure(layout_title_text="first"), pd.DataFrame({"a": [1]}))
    first = area.outputs
    assert [o["output_type"] for o in first] == ["display_data", "display_data"]
    assert "application/vnd.plotly.v1+json" in first[0]["data"]
    assert "text/html" in first[1]["data"]
    widgets.show_in(area, go.Figure(layout_title_text="second"))
    assert len(area.outputs) == 1 and "second" in area.outputs[0]["data"]["text/plain"]


def test_slider_explorer_lays_out_rows_and_extra_widgets_and_guards_its_names():
    import plotly.graph_objects as go

    def view(a, b, c):
        return go.Figure(), f"{a + b + c}"

    note = W.HTML("note")
    ex = widgets.SliderExplorer(view, rows=[["c"], ["a", "b"]], extra=[note],
                                a=W.IntSlider(value=1), b=W.IntSlider(value=2),
                                c=W.IntSlider(value=3))
    first, second, verdict, extra, output = ex.widget.children
    assert list(first.children) == [ex.c] and list(second.children) == [ex.a, ex.b]
    assert verdict is ex.verdict and extra is note and output is ex.output
    ex.b.value = 5                                       # a control by its name, as attribute
    assert ex.verdict.value == "9"
    with pytest.raises(ValueError, match="every control once"):
        widgets.SliderExplorer(view, rows=[["a", "b"]], a=W.IntSlider(), b=W.IntSlider(),
                               c=W.IntSlider())
    with pytest.raises(ValueError, match="may not be called 'figure'"):
        widgets.SliderExplorer(lambda figure: (go.Figure(), ""), figure=W.IntSlider())
