"""toolkit.viz.tensor_parallel's figures (blocks, traffic, times) and lesson 12's explorer
(toolkit.widgets.tensor_parallel), without a browser."""

from __future__ import annotations

import json
import math

import ipywidgets as W
import numpy as np
import pytest

from toolkit import cost
from toolkit.viz import tensor_parallel as tpviz
from toolkit.widgets.tensor_parallel import TP_CHOICES, tp_explorer

MIME = "application/vnd.plotly.v1+json"


@pytest.mark.parametrize("kind", ["column", "row"])
@pytest.mark.parametrize("p", [1, 2, 4])
def test_matmul_split_draws_one_coloured_block_per_rank_with_its_shape(kind, p):
    fig = tpviz.matmul_split(kind, p)
    texts = [a.text for a in fig.layout.annotations]
    # column: X whole + p blocks of A + p blocks of Y; row: p of X + p of A + Y; then "·", "=".
    assert len(fig.layout.shapes) == 2 * p + 1
    if kind == "column":
        assert sum(t.startswith("A") and f"4h/{p}" in t for t in texts) == p
        assert sum(t.startswith("Y") for t in texts) == p and "every rank" in texts[0]
    else:
        assert sum(t.startswith("X") and f"h/{p}" in t for t in texts) == p
        assert sum("all-reduce" in t for t in texts) == 1
    colours = {s.fillcolor for s in fig.layout.shapes}
    assert len(colours) == p + 1  # one colour per rank, grey for the whole X (column) or Y (row)


def test_matmul_split_refuses_unknown_kinds_and_sizes():
    with pytest.raises(ValueError, match="kind must be 'column' or 'row'"):
        tpviz.matmul_split("diagonal", 2)
    with pytest.raises(ValueError, match="p must be an int from 1"):
        tpviz.matmul_split("row", 0)


def test_layer_traffic_is_megatrons_count_on_a_ring():
    t = tpviz.layer_traffic(batch=4, seq=1024, hidden=4096, p=4)
    act = 4 * 1024 * 4096 * 2
    assert t["tp_forward"] == t["tp_backward"] == 2 * act * 2 * 3 / 4
    assert t["dp"] == 12 * 4096 ** 2 * 2 * 2 * 3 / 4
    # TP over DP is b·s / (3h), whatever p is.
    t8 = tpviz.layer_traffic(batch=1, seq=2048, hidden=12288, p=8)
    assert (t8["tp_forward"] + t8["tp_backward"]) / t8["dp"] == pytest.approx(2048 / (3 * 12288))


def test_traffic_bars_one_group_per_label_with_readable_bytes():
    fig = tpviz.traffic_bars({"recorded": {"tp": 2048.0, "dp": 1 << 20},
                              "formula": {"tp": 2048.0, "dp": 1 << 20}}, title="t")
    assert [b.name for b in fig.data] == ["recorded", "formula"]
    # Drawn in MiB, the unit of the largest bar; labels in the axis's unit.
    assert list(fig.data[0].x) == ["tp", "dp"] and list(fig.data[1].y) == [2048 / 2**20, 1.0]
    assert fig.layout.yaxis.title.text == "MiB" and fig.data[0].text[1] == "1 MiB"
    assert fig.data[0].text[0] == "0.001953 MiB" and fig.layout.barmode == "group"


def test_tp_layer_time_is_the_alpha_beta_ring_and_the_flop_count():
    link = cost.AlphaBeta(alpha=10e-6, beta=1 / 50e9)
    t = tpviz.tp_layer_time(hidden=12288, tp=8, tokens=2048, seq=2048, link=link,
                            peak_flops=989e12)
    flops = 72 * 2048 * 12288 ** 2 * (1 + 2048 / (6 * 12288))
    assert t["compute"] == pytest.approx(flops / 8 / (0.5 * 989e12))
    n = 2048 * 12288 * 2
    assert t["allreduce_bytes"] == n
    assert t["comm"] == pytest.approx(4 * (14 * 10e-6 + 2 * 7 / 8 * n / 50e9))
    solo = tpviz.tp_layer_time(hidden=1024, tp=1, tokens=512, seq=512, link=link,
                               peak_flops=1e12)
    assert solo["comm"] == 0
    with pytest.raises(ValueError, match="need hidden, tp, tokens, seq >= 1"):
        tpviz.tp_layer_time(hidden=1024, tp=0, tokens=512, seq=512, link=link, peak_flops=1e12)


def test_tp_time_view_lines_marker_links_and_verdict():
    fig, verdict = tpviz.tp_time_view(hidden=12288, tp=8, tokens=2048, bandwidth_gbs=50)
    comm, compute, marker = fig.data
    assert len(comm.x) == 61 and comm.x[0] == pytest.approx(1) and comm.x[-1] == pytest.approx(1e3)
    assert np.all(np.diff(comm.y) < 0)             # faster links, shorter all-reduces
    assert np.ptp(compute.y) == 0                  # compute does not care about the link
    link = cost.AlphaBeta(alpha=10e-6, beta=1 / 50e9)
    here = tpviz.tp_layer_time(hidden=12288, tp=8, tokens=2048, seq=2048, link=link,
                               peak_flops=989e12)
    assert marker.x[0] == 50 and marker.y[0] == pytest.approx(here["comm"] * 1e3)
    assert len(fig.layout.shapes) == len(tpviz.LINKS)
    xs = sorted(s.x0 for s in fig.layout.shapes)
    assert xs == pytest.approx(sorted(link.bandwidth / 1e9 for link in tpviz.LINKS.values()))
    # Annotations sit in log10 units on the log axis, on their dotted lines.
    assert sorted(a.x for a in fig.layout.annotations) == pytest.approx([math.log10(x) for x in xs])
    share = here["comm"] / (here["comm"] + here["compute"])
    assert f"{share:.0%}" in verdict and "at 50 GB/s" in verdict
    _, solo = tpviz.tp_time_view(hidden=1024, tp=1, tokens=512, bandwidth_gbs=10)
    assert "nothing to send" in solo
    with pytest.raises(ValueError, match="bandwidth > 0"):
        tpviz.tp_time_view(hidden=1024, tp=2, tokens=512, bandwidth_gbs=0)


def shown(explorer) -> dict:
    (out,) = explorer.output.outputs
    json.dumps(out)  # travels to the browser as JSON
    return out["data"][MIME]


def test_explorer_draws_at_once_and_redraws_on_every_slider():
    ex = tp_explorer()
    assert isinstance(ex.widget, W.VBox)
    assert (ex.hidden.value, ex.tp.value, ex.tokens.value) == (12288, 8, 2048)
    assert "h = 12,288, tp = 8" in shown(ex)["layout"]["title"]["text"]
    first = ex.verdict.value
    _, want = tpviz.tp_time_view(hidden=12288, tp=8, tokens=2048, bandwidth_gbs=50)
    assert first == want

    ex.tp.value = 2                      # as if dragged
    assert "tp = 2" in ex.figure.layout.title.text and ex.verdict.value != first
    assert shown(ex)["layout"]["title"]["text"] == ex.figure.layout.title.text
    ex.bandwidth_gbs.value = 450
    assert "at 450 GB/s" in ex.verdict.value
    ex.tokens.value = 8192
    assert "8,192 tokens" in ex.figure.layout.title.text
    ex.hidden.value = 1024
    assert "h = 1,024" in ex.figure.layout.title.text and len(ex.output.outputs) == 1
    ex.tp.value = 1
    assert "nothing to send" in ex.verdict.value
    assert ex._repr_mimebundle_()  # displayable as a cell's last expression


def test_explorer_refuses_values_the_sliders_do_not_offer():
    assert 8 in TP_CHOICES
    with pytest.raises(ValueError, match="tp must be one of"):
        tp_explorer(tp=3)
    with pytest.raises(ValueError, match="hidden must be one of"):
        tp_explorer(hidden=1000)
    assert tp_explorer(bandwidth_gbs=5000).bandwidth_gbs.value == pytest.approx(1000)
