"""toolkit.viz.communicating_less and lesson 15's explorers: the figures draw the numbers given
(running totals, modelled times, errors and bytes per rank r, final losses per learning rate,
steps and examples against batch size);
the views' verdicts follow the α-β model and the SVD; the explorers redraw when a control moves."""

from __future__ import annotations

import math

import pytest
import torch

from toolkit.cost import AlphaBeta
from toolkit.cost.traffic import sync_time_per_step
from toolkit.viz.communicating_less import (
    batch_tradeoff, cumulative_traffic, loss_vs_time, lr_sweep, rank_tradeoff,
)
from toolkit.widgets.communicating_less import (
    local_sgd_explorer, local_sgd_view, powersgd_errors, powersgd_explorer, powersgd_view,
    smoothed, time_to_reach,
)

# Loss curves shaped like section 2's: DDP falls fastest per step, H = 16 slowest.
CURVES = {1: [1.0 / (k + 1) for k in range(64)],
          4: [1.2 / (k + 1) for k in range(64)],
          16: [2.0 / (k + 1) ** 0.8 for k in range(64)]}


def test_cumulative_traffic_draws_running_totals_and_the_formula_dotted():
    recorded = {"DDP": [40, 40, 40, 40], "H = 2": [0, 40, 0, 40]}
    fig = cumulative_traffic(recorded, predicted={"H = 2": [0, 40, 0, 40]})
    assert [t.name for t in fig.data] == ["DDP", "H = 2", "H = 2: formula"]
    assert list(fig.data[0].y) == [40, 80, 120, 160] and list(fig.data[1].y) == [0, 40, 40, 80]
    assert list(fig.data[0].x) == [1, 2, 3, 4]
    assert fig.data[2].line.dash == "dot" and fig.data[2].line.color == fig.data[1].line.color
    with pytest.raises(ValueError, match="recorded is empty"):
        cumulative_traffic({})


def test_loss_vs_time_sets_each_step_at_its_modelled_seconds():
    fig = loss_vs_time({"a": [3.0, 2.0, 1.0], "b": [3.0, 1.0]}, {"a": 0.5, "b": 2.0}, target=1.5)
    assert list(fig.data[0].x) == [0.5, 1.0, 1.5] and list(fig.data[1].x) == [2.0, 4.0]
    assert list(fig.data[1].y) == [3.0, 1.0] and fig.layout.yaxis.type == "log"
    assert [s.y0 for s in fig.layout.shapes] == [1.5]
    with pytest.raises(ValueError, match=r"no seconds_per_step for \['b'\]"):
        loss_vs_time({"a": [1.0], "b": [1.0]}, {"a": 1.0})


def test_rank_tradeoff_two_panels_and_checks_lengths():
    fig = rank_tradeoff([1, 2], {"one": [0.5, 0.3], "svd": [0.4, 0.2]}, [800, 1600],
                        dense_bytes=16384, chosen=2)
    lines = [t for t in fig.data if t.type == "scatter"]
    (bars,) = [t for t in fig.data if t.type == "bar"]
    assert [t.name for t in lines] == ["one", "svd"] and list(lines[1].y) == [0.4, 0.2]
    assert list(bars.y) == [800, 1600] and bars.xaxis == "x2"
    assert 16384 in [s.y0 for s in fig.layout.shapes]
    assert sum(s.x0 == 2 for s in fig.layout.shapes) == 2          # the chosen r, both panels
    with pytest.raises(ValueError, match="one value per rank"):
        rank_tradeoff([1, 2], {"one": [0.5]}, [800, 1600], dense_bytes=1)


def test_lr_sweep_puts_runs_that_blew_up_at_the_initial_loss():
    fig = lr_sweep({"SGD": {0.1: 0.2, 1.0: math.nan, 3.0: math.inf}, "LAMB": {0.01: 0.05}},
                   initial=0.9)
    assert [t.name for t in fig.data] == ["SGD", "SGD: blew up", "LAMB"]
    assert list(fig.data[0].x) == [0.1] and list(fig.data[1].x) == [1.0, 3.0]
    assert list(fig.data[1].y) == [0.9, 0.9] and fig.data[1].marker.symbol == "x"
    assert fig.layout.xaxis.type == fig.layout.yaxis.type == "log"


def test_smoothed_is_a_trailing_mean_and_time_to_reach_uses_it():
    assert smoothed([1.0, 3.0, 5.0, 7.0], window=2) == [1.0, 2.0, 4.0, 6.0]
    losses = [1.0] * 8 + [0.0] * 8                       # the mean of 8 reaches 0.5 at step 12
    assert time_to_reach(losses, 0.5, 2.0) == 24.0
    assert time_to_reach(losses, -1.0, 2.0) == math.inf


@pytest.mark.parametrize("gbs, alpha_us, winner", [(0.1, 20.0, "H = 16"), (300.0, 1.0, "DDP")])
def test_local_sgd_view_follows_the_alpha_beta_model(gbs, alpha_us, winner):
    fig, html = local_sgd_view(CURVES, sync_every=16, params=1e9, world_size=64,
                               alpha_us=alpha_us, bandwidth_gbs=gbs, compute_ms=500.0)
    sync = sync_time_per_step(4e9, 64, AlphaBeta(alpha=alpha_us * 1e-6, beta=1 / (gbs * 1e9)))
    ddp, local = fig.data
    assert ddp.x[0] == pytest.approx(0.5 + sync) and local.x[0] == pytest.approx(0.5 + sync / 16)
    target = max(smoothed(CURVES[1])[-1], smoothed(CURVES[16])[-1])
    assert fig.layout.shapes[0].y0 == pytest.approx(target)
    assert f"<b>{winner} gets there first</b>" in html
    with pytest.raises(ValueError, match="H = 1 .DDP. and H = 8"):
        local_sgd_view(CURVES, sync_every=8, params=1e9, world_size=64, alpha_us=1.0,
                       bandwidth_gbs=1.0, compute_ms=1.0)
    with pytest.raises(ValueError, match="bandwidth_gbs must be > 0"):
        local_sgd_view(CURVES, sync_every=4, params=1e9, world_size=64, alpha_us=1.0,
                       bandwidth_gbs=0.0, compute_ms=1.0)


def test_local_sgd_explorer_redraws_when_the_link_slows():
    explorer = local_sgd_explorer(CURVES, params=1e9, world_size=64, alpha_us=1.0,
                                  bandwidth_gbs=300.0, compute_ms=500.0)
    assert explorer.controls["sync_every"].options == (4, 16)
    assert "<b>DDP gets there first</b>" in explorer.verdict.value
    explorer.controls["log_bandwidth"].value = -1.0
    assert "<b>H = 16 gets there first</b>" in explorer.verdict.value
    with pytest.raises(ValueError, match="at least one H > 1"):
        local_sgd_explorer({1: CURVES[1]})


def test_powersgd_errors_exact_at_full_rank_and_never_below_the_svd():
    gen = torch.Generator().manual_seed(0)
    low = torch.randn(12, 2, generator=gen) @ torch.randn(2, 9, generator=gen)   # rank 2
    errs = powersgd_errors(low, [1, 2, 3])
    assert errs["best rank r (SVD)"][1] < 1e-6 and errs["1 power step"][1] < 1e-5
    full = torch.randn(12, 9, generator=gen)
    errs = powersgd_errors(full, [1, 2, 4, 8])
    for key in ("1 power step", "4 power steps"):
        assert all(a >= b - 1e-6 for a, b in zip(errs[key], errs["best rank r (SVD)"]))
    assert errs["best rank r (SVD)"] == sorted(errs["best rank r (SVD)"], reverse=True)
    with pytest.raises(ValueError, match="must be 2-D"):
        powersgd_errors(torch.ones(3), [1])


def test_powersgd_view_and_explorer_report_bytes_and_the_compression_rule():
    gen = torch.Generator().manual_seed(1)
    matrices = {"wide": torch.randn(64, 64, generator=gen),
                "thin": torch.randn(4, 4, generator=gen)}
    fig, html_wide = powersgd_view(matrices, layer="wide", rank=4)
    assert f"{4 * 4 * 128:,} bytes instead of {4 * 64 * 64:,}" in html_wide
    assert "8.0× less" in html_wide
    (bars,) = [t for t in fig.data if t.type == "bar"]
    assert list(bars.y) == [4 * r * 128 for r in range(1, 9)]
    _, html = powersgd_view(matrices, layer="thin", rank=1, max_rank=4)
    assert "sent uncompressed" in html                  # 1·(4 + 4)·2 ≥ 16
    with pytest.raises(ValueError, match="layer must be one of"):
        powersgd_view(matrices, layer="nope", rank=1)
    with pytest.raises(ValueError, match="rank must be in 1 … max_rank = 8"):
        powersgd_view(matrices, layer="wide", rank=9)
    known = powersgd_errors(matrices["wide"], range(1, 9))
    assert powersgd_view(matrices, layer="wide", rank=4, errors=known)[1] == html_wide
    explorer = powersgd_explorer(matrices, rank=2, max_rank=8)
    assert f"{4 * 2 * 128:,} bytes" in explorer.verdict.value
    explorer.controls["rank"].value = 8
    assert f"{4 * 8 * 128:,} bytes" in explorer.verdict.value
    explorer.controls["layer"].value = "thin"
    assert "4 × 4" in explorer.figure.layout.title.text
    with pytest.raises(ValueError, match="matrices is empty"):
        powersgd_explorer({})


def test_batch_tradeoff_draws_the_hyperbola_and_marks_batches():
    fig = batch_tradeoff({"early": 10.0, "late": 100.0}, batches=[16, 512])
    assert [t.name for t in fig.data] == ["early: steps S/S_min", "early: examples E/E_min",
                                          "late: steps S/S_min", "late: examples E/E_min"]
    steps, examples = fig.data[0], fig.data[1]
    for b, s, e in zip(steps.x, steps.y, examples.y):
        assert s == pytest.approx(1 + 10 / b) and (s - 1) * (e - 1) == pytest.approx(1.0)
    assert min(steps.x) <= 16 / 3 and max(steps.x) >= 512 * 3
    assert len(fig.layout.shapes) == 2
    with pytest.raises(ValueError, match="numbers > 0"):
        batch_tradeoff({"bad": math.inf})
