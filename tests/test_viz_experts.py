"""toolkit.viz.experts and the capacity explorer: the curves follow the formulas of
toolkit.cost.experts, the view marks the chosen factor and says what it costs, and the explorer
redraws when a slider moves."""

from __future__ import annotations

import pytest

from toolkit.cost.experts import expert_capacity
from toolkit.viz.experts import capacity_curves, capacity_view, expert_loads, violation_curves
from toolkit.widgets import capacity_explorer


def test_balanced_router_drops_nothing_at_cf_one_and_pads_nothing() -> None:
    c = capacity_curves(num_experts=8, top_k=2, tokens=4096, imbalance=1.0, hidden=64, ep=8,
                        elem_bytes=2, factors=[1.0, 2.0])
    assert c["capacity"] == [1024, 2048] and c["dropped"] == [0.0, 0.0]
    assert c["padding"] == [0.0, 0.5]
    counts = 7 * 8  # E/ep = 1 count to each of the 7 other ranks, forward
    rows = 2 * 4096 * 7 / 8  # k·T rows, (ep − 1)/ep of them leave the rank
    assert c["ragged_bytes"] == [counts + 4 * rows * 64 * 2] * 2  # kept rows only
    assert c["padded_bytes"] == [counts + 4 * rows * 64 * 2, counts + 8 * rows * 64 * 2]


def test_skewed_router_drops_what_exceeds_the_hot_expert_capacity() -> None:
    c = capacity_curves(num_experts=8, top_k=1, tokens=800, imbalance=3.0, hidden=8, ep=4,
                        factors=[1.0, 3.0, 4.0])
    # Hot expert: 3 × 100 = 300 choices; C = 100 at cf = 1: 200 of 800 dropped; none at cf 3.
    assert c["dropped"] == [pytest.approx(0.25), 0.0, 0.0]
    assert c["ragged_bytes"][1] == c["ragged_bytes"][2] < c["padded_bytes"][2]
    assert all(a >= b for a, b in zip(c["dropped"], c["dropped"][1:]))


def test_view_marks_the_factor_and_says_what_it_costs() -> None:
    fig, verdict = capacity_view(capacity_factor=1.25, imbalance=2.0, num_experts=8, top_k=2,
                                 tokens=4096, hidden=4096, ep=8)
    c = expert_capacity(4096, 8, top_k=2, capacity_factor=1.25)
    assert f"C = {c:,} slots" in verdict and "dropped" in verdict
    markers = [t for t in fig.data if t.mode == "markers"]
    assert len(markers) == 4 and all(t.x == (1.25,) for t in markers)
    # Hot expert 2 × 1024 choices against C = 1280: 768 of 8192 dropped.
    dropped = next(t for t in markers if t.marker.color == "#d62728")
    assert dropped.y[0] == pytest.approx(100 * 768 / 8192)
    with pytest.raises(ValueError, match="ep=3 must divide num_experts=8"):
        capacity_view(capacity_factor=1.0, imbalance=1.0, ep=3)


def test_expert_loads_and_the_explorer() -> None:
    fig = expert_loads([5, 1, 2], [3, 1, 2], 3)
    assert [list(t.y) for t in fig.data] == [[3, 1, 2], [2, 0, 0]]
    assert "dropped 2" in fig.layout.title.text
    with pytest.raises(ValueError, match="kept must be one count <= load"):
        expert_loads([1, 2], [2, 2], 2)
    explorer = capacity_explorer()
    before = explorer.verdict.value
    explorer.capacity_factor.value = 3.0
    assert explorer.verdict.value != before and "cf = 3.00" in explorer.verdict.value
    explorer.num_experts.value = 64
    assert "E = 64" in explorer.figure.layout.title.text
    with pytest.raises(ValueError, match="num_experts must be one of"):
        capacity_explorer(num_experts=6)


def test_violation_curves_one_line_per_series_from_zero():
    fig = violation_curves({"without": [1.5, 1.4], "with bias": [1.5, 0.2]}, title="t")
    assert [d.name for d in fig.data] == ["without", "with bias"]
    assert list(fig.data[1].x) == [1, 2] and list(fig.data[1].y) == [1.5, 0.2]
    assert fig.layout.yaxis.rangemode == "tozero"
    with pytest.raises(ValueError, match="non-empty series"):
        violation_curves({"empty": []})
