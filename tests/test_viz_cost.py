"""viz.cost_curves, bus_bandwidth, predicted_times, cost_terms, traffic_and_rounds: pure figures of
measured tables and of the α-β model. Checked by what they draw (traces, values, axes)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from toolkit import cost, viz
from toolkit.cost import human_bytes

LINK = cost.AlphaBeta(alpha=100e-6, beta=1e-9)  # 100 µs, 1 GB/s
SIZES = [4096, 65536, 1 << 20]


def table(algorithms=("ring", "ps", "torch"), ps=(2, 4), collective="all_reduce") -> pd.DataFrame:
    """A table shaped like experiments.collectives.measure's, times from the model (torch: the
    ring's, ×0.9)."""
    rows = []
    for p in ps:
        for alg in algorithms:
            for n in SIZES:
                model = "ring" if alg == cost.TORCH else alg
                t = float(cost.predict(collective, model, n, p, LINK))
                t *= 0.9 if alg == cost.TORCH else 1
                rows.append(dict(collective=collective, algorithm=alg, p=p, nbytes=n, numel=n // 4,
                                 dtype="float32", seconds=t, min_seconds=t, algbw=n / t,
                                 busbw=float(cost.busbw(collective, n, t, p)), backend="gloo"))
    return pd.DataFrame(rows)


def named(fig: go.Figure, name: str, *, xaxis: str | None = None) -> list:
    return [t for t in fig.data if t.name == name and (xaxis is None or t.xaxis == xaxis)]


def test_cost_curves_one_panel_per_p_one_trace_per_algorithm_in_ms():
    fig = viz.cost_curves(table())
    assert [a.text for a in fig.layout.annotations] == ["p = 2 ranks", "p = 4 ranks"]
    assert fig.layout.xaxis.type == fig.layout.xaxis2.type == "log"
    assert fig.layout.yaxis.type == "log" and "ms" in fig.layout.yaxis.title.text
    assert len(fig.data) == 3 * 2                       # no fits: measurements only
    (ring4,) = named(fig, "ring", xaxis="x2")
    assert list(ring4.x) == SIZES
    expected = cost.predict("all_reduce", "ring", np.array(SIZES), 4, LINK) * 1e3
    assert np.allclose(ring4.y, expected)
    assert ring4.showlegend is False and named(fig, "ring", xaxis="x")[0].showlegend is True


def test_cost_curves_overlays_the_model_dotted_and_skips_the_builtin():
    fig = viz.cost_curves(table(), LINK)                # one link for every modelled algorithm
    models = [t for t in fig.data if t.name.endswith(" model")]
    assert sorted({t.name for t in models}) == ["ps model", "ring model"]   # torch: no model
    assert len(models) == 4 and all(t.line.dash == "dot" for t in models)
    (ps2,) = [t for t in models if t.name == "ps model" and t.xaxis == "x"]
    assert ps2.x[0] == SIZES[0] and ps2.x[-1] == pytest.approx(SIZES[-1])
    assert np.allclose(ps2.y, cost.predict("all_reduce", "ps", np.array(ps2.x), 2, LINK) * 1e3)
    assert "dotted" in fig.layout.title.text


def test_cost_curves_fits_by_algorithm_and_by_algorithm_and_p():
    other = cost.AlphaBeta(alpha=1e-3, beta=0.0)
    fit = cost.fit_alpha_beta(table(("ring",), ps=(2,)))    # a Fit works as well as a link
    fig = viz.cost_curves(table(), {"ring": fit, ("ring", 4): other})
    (r2,) = [t for t in fig.data if t.name == "ring model" and t.xaxis == "x"]
    (r4,) = [t for t in fig.data if t.name == "ring model" and t.xaxis == "x2"]
    assert np.allclose(r2.y, cost.predict("all_reduce", "ring", np.array(r2.x), 2, fit.link) * 1e3)
    assert np.allclose(r4.y, 6 * 1e-3 * 1e3)               # (ring, 4) wins: 6 rounds of 1 ms
    assert not [t for t in fig.data if t.name == "ps model"]  # ps has no fit here


@pytest.mark.parametrize("call, error, words", [
    (lambda: viz.cost_curves([1, 2]), TypeError, "DataFrame"),
    (lambda: viz.cost_curves(table().drop(columns="seconds")), ValueError, "seconds"),
    (lambda: viz.cost_curves(pd.concat([table(), table(("ring",), collective="all_gather")])),
     ValueError, "mixes collectives"),
    (lambda: viz.cost_curves(table(), collective="broadcast"), ValueError, "no rows"),
    (lambda: viz.cost_curves(table().assign(seconds=0.0)), ValueError, "> 0"),
    (lambda: viz.cost_curves(table(), {"torch": LINK}), ValueError, "no cost model"),
    (lambda: viz.cost_curves(table(), {"tree": LINK}), ValueError, "not in the table"),
    (lambda: viz.cost_curves(table(), {"ring": 1e-4}), TypeError, "AlphaBeta or a Fit"),
    (lambda: viz.cost_curves(table(), [LINK]), TypeError, "dict"),
    (lambda: viz.bus_bandwidth(table(), peak=0), ValueError, "peak"),
    (lambda: viz.bus_bandwidth(table().drop(columns=["busbw", "seconds"])), ValueError, "busbw"),
])
def test_table_figures_reject_bad_input(call, error, words):
    with pytest.raises(error, match=words):
        call()


def test_bus_bandwidth_draws_busbw_in_gbs_and_computes_it_when_missing():
    t = table()
    fig = viz.bus_bandwidth(t, peak=LINK.bandwidth)
    (ring4,) = named(fig, "ring", xaxis="x2")
    rows = t[(t.algorithm == "ring") & (t.p == 4)]
    assert np.allclose(ring4.y, rows.busbw / 1e9)
    assert fig.layout.yaxis.type == "linear" and fig.layout.xaxis.type == "log"
    assert "2(p−1)/p" in fig.layout.title.text
    assert [s.y0 for s in fig.layout.shapes] == [pytest.approx(1.0)] * 2   # 1 GB/s, both panels
    assert [a.text for a in fig.layout.annotations if "GB/s" in a.text] == ["1 GB/s"]
    again = viz.bus_bandwidth(t.drop(columns="busbw"))
    assert np.allclose(named(again, "ring", xaxis="x2")[0].y, ring4.y)
    assert not again.layout.shapes
    # busbw of a bandwidth-bound ring approaches 1/β: the model's 1 MB point is within 70 % of it
    assert 0.7 < ring4.y[-1] < 1.0


def test_predicted_times_one_curve_per_algorithm_and_the_switch_to_the_ring():
    p = 64
    fig = viz.predicted_times(p, LINK, (1e3, 1e9))
    names = [t.name for t in fig.data]
    assert names == ["ring", "ps", "sharded_ps (same model as ring)", "tree", "fastest changes"]
    ring = fig.data[0]
    assert ring.x[0] == pytest.approx(1e3) and ring.x[-1] == pytest.approx(1e9)
    assert np.allclose(ring.y, cost.predict("all_reduce", "ring", np.array(ring.x), p, LINK) * 1e3)
    assert fig.data[2].line.dash == "dash"                     # drawn over the ring, visibly
    (switch,) = [t for t in fig.data if t.name == "fastest changes"]
    n_star = cost.crossover_bytes("all_reduce", "ring", "tree", p, LINK)
    assert list(switch.x) == [pytest.approx(n_star)]
    assert tuple(switch.customdata[0][:2]) == ("tree", "ring = sharded_ps")
    assert fig.layout.xaxis.type == fig.layout.yaxis.type == "log"


def test_predicted_times_marks_a_size_with_the_fastest_algorithm():
    fig = viz.predicted_times(64, LINK, mark=1 << 10)
    (line,) = fig.layout.shapes
    assert line.x0 == line.x1 == 1024
    assert "1 KiB: tree fastest" in fig.layout.annotations[0].text
    few = viz.predicted_times(4, LINK, (1e3, 1e9), ["ring", "ps"])
    assert [t.name for t in few.data] == ["ring", "ps"]       # ring always wins: no switch


def test_switch_points_and_fastest_follow_the_model():
    # p = 2: ring (2α + nβ) beats tree and PS (2α + 2nβ) at every size; nothing switches.
    assert cost.switch_points(2, LINK, (1, 1e12)) == []
    best, times = cost.fastest(2, LINK, 1e6)
    assert best == "ring = sharded_ps" and set(times) == {"ring", "ps", "sharded_ps", "tree"}
    assert times["ps"] == pytest.approx(float(cost.predict("all_reduce", "ps", 1e6, 2, LINK)))
    [(n, below, above)] = cost.switch_points(1024, LINK, (1, 1e12), ["ring", "tree"])
    assert (below, above) == ("tree", "ring")
    assert n == pytest.approx(cost.crossover_bytes("all_reduce", "ring", "tree", 1024, LINK))
    assert cost.fastest(1024, LINK, n / 2, ["ring", "tree"])[0] == "tree"
    assert cost.fastest(1024, LINK, n * 2, ["ring", "tree"])[0] == "ring"


@pytest.mark.parametrize("call, error, words", [
    (lambda: viz.predicted_times(1, LINK), ValueError, "int >= 2"),
    (lambda: viz.predicted_times(4.0, LINK), ValueError, "int >= 2"),
    (lambda: viz.predicted_times(4, (1e-4, 1e-9)), TypeError, "AlphaBeta"),
    (lambda: viz.predicted_times(4, cost.AlphaBeta(-1.0, 1e-9)), ValueError, ">= 0"),
    (lambda: viz.predicted_times(4, LINK, (1e6, 1e3)), ValueError, "0 < low < high"),
    (lambda: viz.predicted_times(4, LINK, algorithms=["ring", "butterfly"]), ValueError,
     "butterfly"),
    (lambda: viz.predicted_times(4, LINK, algorithms=[]), ValueError, "no algorithms"),
    (lambda: viz.predicted_times(4, LINK, collective="permute"), ValueError, "no cost model"),
    (lambda: viz.predicted_times(4, LINK, (1e3, 1e6), mark=1e9), ValueError, "outside"),
    (lambda: viz.cost_terms(LINK, 1e6, []), ValueError, "at least one"),
    (lambda: viz.cost_terms(LINK, 0, [4]), ValueError, "> 0"),
    (lambda: viz.cost_terms(LINK, 1e6, [4], algorithm="torch"), ValueError, "torch"),
    (lambda: viz.traffic_and_rounds([1, 4]), ValueError, ">= 2"),
    (lambda: viz.traffic_and_rounds([2, 4], recorded=pd.DataFrame({"p": [2]})), ValueError,
     "bytes_sent"),
])
def test_model_figures_reject_bad_input(call, error, words):
    with pytest.raises(error, match=words):
        call()


def test_cost_terms_stack_to_the_prediction_and_latency_takes_over_as_p_grows():
    ps, n = [2, 8, 64, 1024], 64 << 10
    fig = viz.cost_terms(LINK, n, ps)
    lat, bw = fig.data
    assert list(lat.x) == ["2", "8", "64", "1024"] and fig.layout.barmode == "stack"
    total = np.array(lat.y) + np.array(bw.y)
    assert np.allclose(total, [float(cost.predict("all_reduce", "ring", n, p, LINK)) * 1e3
                               for p in ps])
    share = np.array(lat.y) / total
    assert (np.diff(share) > 0).all() and share[-1] > 0.9    # 2(p−1)α grows, 2(p−1)/p·nβ < 2nβ
    assert bw.y[-1] < 2 * n * LINK.beta * 1e3
    shares = viz.cost_terms(LINK, n, ps, share=True)
    assert shares.layout.barnorm == "percent" and "%" in shares.layout.yaxis.title.text
    assert list(shares.data[0].y) == list(lat.y)            # plotly normalises; the data stay ms


def test_traffic_and_rounds_formulas_and_recorded_points():
    ps = [2, 4, 16, 1024]
    rec = pd.DataFrame(dict(algorithm=["ring", "ring"], p=[2, 4], nbytes=[400, 400],
                            bytes_sent=[400, 600]))
    fig = viz.traffic_and_rounds(ps, ["ring", "ps"], recorded=rec)
    ring_bytes, ring_rounds = named(fig, "ring")
    ps_bytes, _ = named(fig, "ps")
    assert np.allclose(ring_bytes.y, [2 * (p - 1) / p for p in ps]) and max(ring_bytes.y) < 2
    assert list(ps_bytes.y) == [p - 1 for p in ps]
    assert list(ring_rounds.y) == [2 * (p - 1) for p in ps] and ring_rounds.xaxis == "x2"
    (points,) = named(fig, "ring (recorded)")
    assert list(points.y) == [1.0, 1.5] and points.marker.symbol == "circle-open"
    assert fig.layout.xaxis.type == fig.layout.yaxis2.type == "log"


def test_human_bytes():
    assert [human_bytes(n) for n in (512, 4096, 1.5 * 2 ** 20, 2 ** 30)] == [
        "512 B", "4 KiB", "1.5 MiB", "1 GiB"]
    assert math.isclose(float(human_bytes(3000).split()[0]), 2.93)


# -- regime_curves and slice_speedups (toolkit.viz.regimes) -------------------------------------

def _two_regime_table(ps=(2, 4)) -> pd.DataFrame:
    """Times from two links, a step at 1 MB, with interquartile ranges ±10 %."""
    step, slow = 1 << 20, cost.AlphaBeta(alpha=400e-6, beta=2e-9)
    rows = []
    for p in ps:
        for n in [4096 * 4 ** k for k in range(7)]:
            t = float(cost.predict("all_reduce", "ring", n, p, LINK if n < step else slow))
            rows.append(dict(collective="all_reduce", algorithm="sliced_ring", p=p, nbytes=n,
                             numel=n // 4, seconds=t, q25_seconds=0.9 * t, q75_seconds=1.1 * t))
    return pd.DataFrame(rows)


def test_regime_curves_draw_each_regime_and_its_boundary():
    t = _two_regime_table()
    fits = {("sliced_ring", p): cost.fit_piecewise(cost.as_model(t[t.p == p], "sliced_ring"))
            for p in (2, 4)}
    fig = viz.regime_curves(t, fits)
    measured = [d for d in fig.data if d.mode == "markers"]
    assert len(measured) == 2 and np.allclose(measured[0].y, t[t.p == 2].seconds * 1e3)
    assert np.allclose(measured[0].error_y.array, 0.1 * t[t.p == 2].seconds * 1e3)
    lines = [d for d in fig.data if d.mode == "lines"]
    assert sorted({d.name for d in lines}) == ["sliced_ring regime 1", "sliced_ring regime 2"]
    assert len(lines) == 4                                    # two regimes × two panels
    (r1,) = [d for d in lines if d.name.endswith("1") and d.xaxis == "x"]
    assert max(r1.x) < 1 << 20 and np.allclose(
        r1.y, cost.predict("all_reduce", "ring", np.array(r1.x), 2, LINK) * 1e3)
    edges = [s.x0 for s in fig.layout.shapes]
    assert len(edges) == 2 and all(256 << 10 < e < 1 << 20 for e in edges)
    with pytest.raises(TypeError, match="PiecewiseFit"):
        viz.regime_curves(t, {("sliced_ring", 2): LINK})


def test_slice_speedups_measured_and_modelled():
    rows = []
    for p in (2, 4):
        for n in (1 << 20, 16 << 20):
            rows.append(dict(collective="all_reduce", algorithm="ring", p=p, nbytes=n,
                             numel=n // 4, seconds=1.0))
            for sb, sec in ((n // p, 0.9), (n // (4 * p), 0.8), (n // (64 * p), 1.6)):
                rows.append(dict(collective="all_reduce", algorithm=f"sliced_ring:slice_bytes={sb}",
                                 p=p, nbytes=n, numel=n // 4, seconds=sec))
    t = pd.DataFrame(rows)
    fig = viz.slice_speedups(t)
    measured = [d for d in fig.data if d.xaxis == "x"]
    assert [d.name for d in measured] == ["1 MiB", "16 MiB"]
    assert list(measured[0].x) == [1, 4, 64]                 # slices per chunk
    assert np.allclose(measured[0].y, [1 / 0.9, 1 / 0.8, 1 / 1.6])
    modelled = viz.slice_speedups(t, links={2: LINK, 4: LINK}, gamma=1e-9)
    dotted = [d for d in modelled.data if d.line.dash == "dot"]
    assert len(dotted) == 4 and dotted[0].y[0] == pytest.approx(1.0)   # S = 1: the simple ring
    assert np.allclose(dotted[0].y, cost.slicing_speedup(1 << 20, 2, LINK, gamma=1e-9,
                                                         slices=np.array(dotted[0].x)))
    with pytest.raises(ValueError, match="--slices"):
        viz.slice_speedups(t[t.algorithm == "ring"])
    with pytest.raises(ValueError, match="both"):
        viz.slice_speedups(t, links={2: LINK})
