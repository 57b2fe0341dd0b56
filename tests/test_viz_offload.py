"""Figures and the explorer of lesson 09: pure views of the offload models and of measured
spans (no kernel, no browser)."""

from __future__ import annotations

import math

import pytest

from toolkit.cost import AlphaBeta
from toolkit.cost.offload import PUBLISHED, Span, TierLink, iteration_time, step_time
from toolkit.memory import GB, GiB
from toolkit.memory.offload import PLACEMENTS, ZERO_OFFLOAD, offload_bytes
from toolkit.viz.offload import bandwidth_bars, offload_timeline, offload_view, tier_bars
from toolkit.widgets.offload import offload_explorer


def test_bandwidth_bars_one_trace_per_group_on_a_log_axis():
    rows = [(p.link, p.bytes_per_s, "published") for p in PUBLISHED] + [("here", 2e9, "here")]
    fig = bandwidth_bars(rows)
    assert [t.name for t in fig.data] == ["published", "here"]
    assert fig.layout.xaxis.type == "log"
    assert list(fig.data[1].x) == [2.0] and len(fig.data[0].y) == len(PUBLISHED)


def test_tier_bars_stack_parts_per_tier_and_mark_capacity():
    bars = {name: offload_bytes(13e9, p) for name, p in PLACEMENTS.items()}
    fig = tier_bars(bars, capacity={"gpu": 32 * GiB, "cpu": 1.5 * 2 ** 40})
    optimizer = next(t for t in fig.data if t.name == "optimizer")
    ys = dict(zip(zip(*optimizer.x), optimizer.y))
    assert ys[("ZeRO-Offload", "cpu")] == pytest.approx(12 * 13e9 / GB)
    assert ys[("ZeRO-Offload", "gpu")] == 0
    cap = next(t for t in fig.data if t.name == "capacity")
    assert list(cap.y[:3]) == [32 * GiB / GB, 1.5 * 2 ** 40 / GB, 0]


def test_timeline_rows_per_run_and_lane_and_bars_per_kind():
    link = TierLink("x", AlphaBeta(1e-4, 1e-9), AlphaBeta(1e-4, 1e-9))
    model = step_time([1000] * 3, tier=link, update=AlphaBeta(0, 1e-7), read_bytes=8,
                      write_bytes=8)
    measured = [Span("main", "update", 0, 10.0, 10.002), Span("io", "read", 0, 9.999, 10.0)]
    fig = offload_timeline({"measured": measured, "model": model.spans})
    rows = list(fig.layout.yaxis.categoryarray)
    assert rows == ["model: I/O thread", "model: update thread", "measured: I/O thread",
                    "measured: update thread"]
    update = next(t for t in fig.data if t.name == "update" and t.y[0].startswith("measured"))
    assert update.base[0] == pytest.approx(1.0) and update.x[0] == pytest.approx(2.0)  # ms
    with pytest.raises(ValueError, match="no spans"):
        offload_timeline({"x": []})


def test_offload_view_memory_and_time_follow_the_models():
    fig, verdict = offload_view(placement="ZeRO-Offload", psi_b=13, tokens=2048, gpu_gib=32,
                                cpu_gib=1536, overlap=False)
    params = next(t for t in fig.data if t.name == "params")
    assert list(params.y) == [pytest.approx(26.0), 0, 0]  # 2Ψ on the GPU, GB
    want = iteration_time(13e9, tokens=2048, params_tier="gpu", optimizer_tier="cpu",
                          peak_flops=100e12, pcie=31.5e9, host=50e9, nvme=3.5e9)
    bars = next(t for t in fig.data if t.type == "bar" and t.x[0] == "compute (GPU)")
    assert list(bars.y) == pytest.approx([want.compute, want.pcie, want.host, want.nvme])
    assert "fits" in verdict and f"step {want.serial:.3g} s" in verdict
    _, plain = offload_view(placement="ZeRO-2, no offload", psi_b=13, gpu_gib=32)
    assert "does not fit</b> (gpu too small)" in plain
    with pytest.raises(ValueError, match="placement must be one of"):
        offload_view(placement="DeepSpeed", psi_b=1)


def test_iteration_time_is_zero_infinity_efficiency_when_alone():
    """With only parameters off the GPU, compute / (compute + transfer) is §4.1's formula."""
    t = iteration_time(1e9, tokens=1024, params_tier="cpu", optimizer_tier="gpu",
                       peak_flops=70e12, pcie=70e9, host=1e9, nvme=1e9)
    assert t.host == t.nvme == 0
    assert math.isclose(t.compute / t.serial, 1024 * 70e9 / (1024 * 70e9 + 70e12))
    offload = iteration_time(1e9, tokens=1024, n_d=4, optimizer_tier="cpu", peak_flops=70e12,
                             pcie=10e9, host=20e9, nvme=1e9)
    assert offload.pcie == 4 * 1e9 / 4 / 10e9 and offload.host == 32 * 1e9 / 4 / 20e9
    infinity = iteration_time(1e9, tokens=1024, params_tier="nvme", optimizer_tier="nvme",
                              peak_flops=70e12, pcie=10e9, host=20e9, nvme=2e9)
    assert infinity.nvme == 40 * 1e9 / 2e9 and infinity.overlapped == infinity.nvme
    with pytest.raises(ValueError, match="params_tier must be one of"):
        iteration_time(1e9, tokens=1, params_tier="disk", peak_flops=1, pcie=1, host=1, nvme=1)


def test_explorer_redraws_when_a_control_moves():
    e = offload_explorer("ZeRO-Offload", psi_b=13, gpu_gib=32)
    assert "fits" in e.verdict.value and e.figure is not None
    e.placement.value = "ZeRO-2, no offload"
    assert "does not fit" in e.verdict.value
    e.psi_b.value = 0.5
    assert "<b style='color:#2ca02c'>fits" in e.verdict.value
    assert ZERO_OFFLOAD.name in [o for o in e.placement.options]
    with pytest.raises(ValueError, match="placement must be one of"):
        offload_explorer("nowhere")
