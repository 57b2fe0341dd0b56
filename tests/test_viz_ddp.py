"""toolkit.viz.ddp and toolkit.widgets.SliderExplorer: lesson 04's figures, pure models and
explorer.

The α-β step model is checked against the formula by hand, the staleness simulation against the
closed-form stability bound of delayed gradient descent, the overlap timeline against a
hand-made trace. No ranks are started.
"""

from __future__ import annotations

import math

import ipywidgets as W
import plotly.graph_objects as go
import pytest

from toolkit.comm.events import Event
from toolkit.cost import AlphaBeta
from toolkit.viz.data_parallel import training_curves
from toolkit.viz.ddp import (EFFICIENCY_TICKS, dp_step_time, overlap_timeline, scaling_figure,
                             scaling_table, stale_sgd)
from toolkit.widgets import SliderExplorer

LINK = AlphaBeta(alpha=100e-6, beta=1e-9)


def _event(rank: int, seq: int, start: float, end: float | None, nbytes: int = 4096) -> Event:
    return Event(rank=rank, seq=seq, op="all_reduce", peer=None, nbytes=nbytes, dtype="float32",
                 shape=(nbytes // 4,), start=start, end=end, async_op=True)


def test_dp_step_time_matches_the_ring_formula_by_hand():
    n, p = 8e6, 4
    t = dp_step_time(p, batch=64, seconds_per_item=1e-3, grad_bytes=n, link=LINK)
    comm = 2 * (p - 1) * LINK.alpha + 2 * (p - 1) / p * n * LINK.beta
    assert t["compute"] == pytest.approx(16e-3)
    assert t["comm"] == pytest.approx(comm)
    assert t["total"] == pytest.approx(16e-3 + comm)
    # One rank: no communication at all; uneven split: the slowest rank's ⌈B/p⌉ items.
    assert dp_step_time(1, batch=64, seconds_per_item=1e-3, grad_bytes=n, link=LINK)["comm"] == 0
    assert dp_step_time(3, batch=64, seconds_per_item=1e-3, grad_bytes=n,
                        link=LINK)["compute"] == pytest.approx(22e-3)


def test_overlap_hides_at_most_the_compute():
    full = dp_step_time(2, batch=4, seconds_per_item=1e-4, grad_bytes=1e8, link=LINK, overlap=1.0)
    assert full["exposed comm"] == pytest.approx(full["comm"] - full["compute"])
    half = dp_step_time(2, batch=4096, seconds_per_item=1e-3, grad_bytes=1e6, link=LINK,
                        overlap=0.5)
    assert half["exposed comm"] == pytest.approx(0.5 * half["comm"])


@pytest.mark.parametrize("bad, message", [
    (dict(p=0), "p must be an int"), (dict(p=True), "p must be an int"), (dict(p=65), "P <= B"),
    (dict(batch=0), "batch must be"), (dict(overlap=1.5), "overlap must be"),
    (dict(seconds_per_item=0.0), "seconds_per_item must be")])
def test_dp_step_time_rejects_bad_arguments(bad, message):
    kwargs = dict(p=2, batch=64, seconds_per_item=1e-3, grad_bytes=1e6, link=LINK) | bad
    with pytest.raises(ValueError, match=message):
        dp_step_time(**kwargs)


def test_scaling_table_efficiency_falls_and_stops_at_the_batch():
    rows = scaling_table([1, 2, 4, 8, 16, 32, 64], batch=16, seconds_per_item=1e-3,
                         grad_bytes=4e6, link=LINK)
    assert [r["p"] for r in rows] == [1, 2, 4, 8, 16]            # P <= B
    eff = [r["efficiency"] for r in rows]
    assert eff[0] == pytest.approx(1.0)
    assert all(a > b for a, b in zip(eff, eff[1:]))
    assert rows[-1]["items per rank"] == 1
    fig = scaling_figure(rows)
    assert [len(t.x) for t in fig.data] == [5, 5, 5]
    assert list(fig.data[2].y) == pytest.approx(eff)
    # The efficiency axis is ticked at round values, not lined up with the time axis's ticks.
    assert fig.layout.yaxis2.tickmode == "array"
    assert list(fig.layout.yaxis2.tickvals) == list(EFFICIENCY_TICKS) == [0, 0.2, 0.4, 0.6, 0.8, 1]
    assert list(fig.layout.yaxis2.ticktext) == ["0", "0.2", "0.4", "0.6", "0.8", "1"]


@pytest.mark.parametrize("k", [0, 1, 2, 4])
def test_stale_sgd_follows_the_delay_stability_bound(k):
    bound = 2 * math.sin(math.pi / (2 * (2 * k + 1)))   # lr·h at the edge (Levin & May 1976)
    below = stale_sgd(k, lr=0.95 * bound, steps=3000, curvatures=(1.0,))
    above = stale_sgd(k, lr=1.05 * bound, steps=3000, curvatures=(1.0,))
    assert below[-1] < 1e-6 and above[-1] > 1e3
    assert len(below) == 3001 and below[0] == pytest.approx(0.5)


def test_stale_sgd_k0_is_gradient_descent_and_diverges_to_inf():
    lr, h = 0.1, (1.0, 10.0)
    losses = stale_sgd(0, lr=lr, steps=3, curvatures=h, start=(1.0, 2.0))
    w = [1.0, 2.0]
    for t in range(1, 4):
        w = [wi * (1 - lr * hi) for wi, hi in zip(w, h)]
        assert losses[t] == pytest.approx(0.5 * sum(hi * wi * wi for hi, wi in zip(h, w)))
    blown = stale_sgd(3, lr=1.0, steps=2000, curvatures=(10.0,))
    assert blown[-1] == math.inf
    with pytest.raises(ValueError, match="staleness"):
        stale_sgd(-1, lr=0.1, steps=3)
    with pytest.raises(ValueError, match="start"):
        stale_sgd(0, lr=0.1, steps=3, curvatures=(1.0,), start=(1.0, 2.0))


def _rows(fig: go.Figure) -> dict[str, float]:
    return dict(zip(fig.layout.yaxis.ticktext, fig.layout.yaxis.tickvals))


def _bars(fig: go.Figure, name: str, rank: int) -> go.Bar:
    """The bar trace `name` of `rank` (each rank's traces lie between its rows' ticks)."""
    rows = _rows(fig)
    (trace,) = [t for t in fig.data if t.name == name and all(
        rows[f"rank {rank} backward"] <= y < rows.get(f"rank {rank + 1} backward", 1e9)
        for y in t.y)]
    return trace


def test_overlap_timeline_draws_compute_and_buckets_per_rank():
    t0 = 1000.0
    compute = {r: [("layer 1", t0, t0 + 0.010), ("layer 0", t0 + 0.010, t0 + 0.020)]
               for r in (0, 1)}
    trace = [_event(0, 0, t0 + 0.011, t0 + 0.015), _event(0, 1, t0 + 0.020, t0 + 0.024, 8192),
             _event(1, 0, t0 + 0.012, t0 + 0.015), _event(1, 1, t0 + 0.021, None),
             Event(rank=0, seq=2, op="broadcast", peer=0, nbytes=4, dtype="float32", shape=(1,),
                   start=t0, end=t0 + 1)]                      # not an all-reduce: left out
    fig = overlap_timeline(trace, compute)
    comm0 = _bars(fig, "all-reduce (one per bucket)", 0)
    assert list(comm0.base) == pytest.approx([11.0, 20.0])
    assert list(comm0.x) == pytest.approx([4.0, 4.0])
    assert list(comm0.text) == ["b0", "b1"]
    assert list(comm0.customdata[1]) == [1, "8,192", "8 KiB"]   # bytes, in IEC units too
    rank1 = _bars(fig, "all-reduce (one per bucket)", 1)
    assert list(rank1.x) == pytest.approx([3.0, 0.0])
    assert list(_bars(fig, "backward compute", 1).base) == pytest.approx([0.0, 10.0])
    rows = _rows(fig)                  # top to bottom: rank 0's two rows, then rank 1's
    assert list(rows) == ["rank 0 backward", "rank 0 all-reduce", "rank 1 backward",
                          "rank 1 all-reduce"]
    assert list(rows.values()) == sorted(rows.values()) and fig.layout.yaxis.autorange == "reversed"
    assert set(comm0.y) == {rows["rank 0 all-reduce"]}   # one after the other: one lane
    assert list(rank1.text) == ["b0", ""]       # a bar of no width has no room for a label
    assert [a.text for a in fig.layout.annotations] == [
        "b0, b1, …: each bucket's all-reduce; 1 bar(s) too narrow for a label: hover for their "
        "bucket"]
    with pytest.raises(ValueError, match="nothing to draw"):
        overlap_timeline([], {})


def test_overlap_timeline_gives_all_reduces_in_flight_together_lanes_of_their_own():
    # Asynchronous all-reduces launched during backward are waited for at its end: their bars
    # overlap in time, so each takes a lane and none covers another's bar or label.
    t0 = 7.0
    compute = {0: [("layer 2", t0, t0 + 0.010), ("layer 1", t0 + 0.010, t0 + 0.040),
                   ("layer 0", t0 + 0.040, t0 + 0.080)]}
    trace = [_event(0, 0, t0 + 0.010, t0 + 0.090), _event(0, 1, t0 + 0.040, t0 + 0.091),
             _event(0, 2, t0 + 0.080, t0 + 0.092)]
    fig = overlap_timeline(trace, compute)
    comm = _bars(fig, "all-reduce (one per bucket)", 0)
    lanes = [y - _rows(fig)["rank 0 backward"] for y in comm.y]
    assert lanes == [1.0, 2.0, 3.0]                   # three in flight at t0 + 80 ms
    assert _rows(fig)["rank 0 all-reduce"] == pytest.approx(_rows(fig)["rank 0 backward"] + 2)
    assert list(comm.text) == ["b0", "b1", "b2"]      # wide, and no longer on top of each other
    assert comm.width == 0.8


@pytest.mark.parametrize("buckets, unlabelled", [(5, 0), (20, 10), (40, 39)])
def test_overlap_timeline_labels_only_bars_wide_enough_and_says_so(buckets, unlabelled):
    # One long bucket and many short ones, as a small cap makes: the short ones get no label
    # (it would overflow into its neighbours or be dropped by plotly unannounced), keep their
    # bucket number on hover, and the figure says how many are unlabelled.
    t0 = 50.0
    compute = {0: [("layer 0", t0, t0 + 0.100)]}
    trace = [_event(0, 0, t0, t0 + 0.030)] + [
        _event(0, i, t0 + 0.030 + 0.070 * (i - 1) / buckets, t0 + 0.030 + 0.070 * i / buckets)
        for i in range(1, buckets)]
    fig = overlap_timeline(trace, compute)
    comm0 = _bars(fig, "all-reduce (one per bucket)", 0)
    labels = list(comm0.text)
    assert labels[0] == "b0"
    narrow = 0.070 / buckets / 0.100        # each short bar's share of the time axis
    for i, (label, width) in enumerate(zip(labels[1:], comm0.x[1:]), start=1):
        wide_enough = narrow >= 0.012 * len(f"b{i}") + 0.01
        assert label == (f"b{i}" if wide_enough else ""), (i, label, width)
    assert [c[0] for c in comm0.customdata] == list(range(buckets))   # hover: every bucket
    assert labels.count("") == unlabelled     # at 20: b1-b9 fit, the three-character b10-b19 not
    notes = [a.text for a in fig.layout.annotations]
    assert notes == ([] if not unlabelled else
                     [f"b0, b1, …: each bucket's all-reduce; {unlabelled} bar(s) too narrow "
                      "for a label: hover for their bucket"])
    assert fig.layout.uniformtext.mode == "hide"   # never shrunk below the label font


def test_training_curves_draw_every_finite_value_and_name_a_blown_up_curve():
    curves = {"k = 0": [1.0, 0.5, 0.25], "k = 4": [1.0, 3e8, 9.08e8, math.inf, math.inf]}
    fig = training_curves(curves, x_title="update")
    drawn = {t.name: list(t.y) for t in fig.data}
    assert drawn == {"k = 0": [1.0, 0.5, 0.25], "k = 4": [1.0, 3e8, 9.08e8]}   # nothing capped
    assert [a.text for a in fig.layout.annotations] == [
        "k = 4: inf at update 3, not drawn from there"]
    assert not training_curves({"a": [1.0, 2.0]}).layout.annotations


def test_slider_explorer_redraws_on_every_change():
    calls = []

    def view(k, lr):
        calls.append((k, lr))
        return go.Figure(layout=dict(title=f"k={k}")), f"k = {k}, lr = {lr}"

    ex = SliderExplorer(view, k=W.IntSlider(value=1, min=0, max=4), lr=W.FloatSlider(value=0.1))
    assert calls == [(1, 0.1)] and ex.verdict.value == "k = 1, lr = 0.1"
    ex.controls["k"].value = 3
    assert calls[-1] == (3, 0.1) and ex.figure.layout.title.text == "k=3"
    (shown,) = ex.output.outputs
    assert "application/vnd.plotly.v1+json" in shown["data"]
    with pytest.raises(ValueError, match="at least one control"):
        SliderExplorer(view)
