"""toolkit.viz.memory_trace: the live-bytes replay, the profiler's [memory] events with who
allocated them (a real profile of this process, and a hand-made trace), and CUDA memory
snapshots (synthetic dictionaries shaped as torch/cuda/memory.py documents them)."""

from __future__ import annotations

import json

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from toolkit.viz.memory_trace import (
    Allocation, allocation_site, memory_timeline, profiler_allocations, replay, segment_table,
    snapshot_allocations, snapshot_summary,
)


def a(t, addr, size, site="s"):
    return Allocation(float(t), addr, size, site)


def test_replay_finds_the_peak_and_what_is_live_there():
    r = replay([a(0, 1, 100, "x"), a(1, 2, 50, "y"), a(2, 1, -100), a(3, 3, 80, "z"),
                a(4, 4, 40, "z"), a(5, 2, -50), a(6, 3, -80)])
    assert r.live == [100, 150, 50, 130, 170, 120, 40]
    assert r.peak == 170 and r.peak_time == 4.0
    assert sorted((b.addr, b.size) for b in r.at_peak) == [(2, 50), (3, 80), (4, 40)]
    assert r.by_site() == [{"site": "z", "bytes": 120, "blocks": 2, "share": 120 / 170},
                           {"site": "y", "bytes": 50, "blocks": 1, "share": 50 / 170}]
    assert r.unmatched_free == 0


def test_replay_sorts_by_time_ignores_frees_of_older_blocks_and_reused_addresses():
    r = replay([a(2, 1, -10), a(0, 5, -30), a(1, 1, 10), a(3, 1, 20)])
    # 5 was allocated before the window: counted, not subtracted; address 1 reused unfreed
    assert r.unmatched_free == 30 and r.live == [0, 10, 0, 20] and r.peak == 20
    assert replay([]).peak == 0 and replay([]).times == []


def trace(events, base_ns=2_000_000_000_000_000_000):
    return {"distributedInfo": {"rank": 0}, "baseTimeNanoseconds": base_ns,
            "traceEvents": events}


def mem(ts, addr, nbytes, *, tid=1, device_type=0, device_id=-1):
    return {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 9,
            "tid": tid, "ts": ts, "args": {"Addr": addr, "Bytes": nbytes, "Total Allocated": 0,
                                           "Total Reserved": 0, "Device Type": device_type,
                                           "Device Id": device_id}}


def op(name, ts, dur, cat="cpu_op", tid=1):
    return {"ph": "X", "cat": cat, "name": name, "pid": 9, "tid": tid, "ts": ts, "dur": dur}


def test_profiler_events_get_their_innermost_operator_and_outermost_annotation():
    t = trace([op("forward", 0, 100, cat="user_annotation"), op("aten::linear", 10, 50),
               op("aten::addmm", 12, 30), mem(20, 0xA, 4096), mem(70, 0xB, 64),
               mem(150, 0xA, -4096), mem(30, 0xC, 8, tid=2),
               mem(40, 0xD, 512, device_type=1, device_id=0)])
    cpu = profiler_allocations(t)
    assert [(x.addr, x.size, x.site) for x in cpu] == [
        (0xA, 4096, "forward · aten::addmm"), (0xC, 8, "(no operator)"),
        (0xB, 64, "forward · (no operator)"), (0xA, -4096, "(no operator)")]
    assert cpu[0].time == pytest.approx(2e9 + 20e-6)
    cuda = profiler_allocations(t, device="cuda", device_id=0)
    assert [(x.addr, x.size) for x in cuda] == [(0xD, 512)]
    with pytest.raises(ValueError, match="profile_memory=True"):
        profiler_allocations(trace([op("aten::mm", 0, 1)]))
    with pytest.raises(ValueError, match="device must be one of"):
        profiler_allocations(t, device="tpu")


def test_a_real_profile_sees_the_activation_it_allocated(tmp_path):
    torch.manual_seed(0)
    w = torch.randn(64, 256)
    x = torch.randn(512, 64)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with record_function("forward"):
            y = torch.relu(x @ w)           # (512, 256) float32: 512 KiB, twice (mm, relu)
        del y
    path = tmp_path / "t.json"
    prof.export_chrome_trace(str(path))
    allocs = profiler_allocations(json.loads(path.read_text()), rank=0)
    r = replay(allocs)
    assert r.peak >= 2 * 512 * 256 * 4       # the matmul's output and relu's, at once
    sites = {row["site"] for row in r.by_site()}
    assert any(s.startswith("forward · aten::") for s in sites)
    assert r.live[-1] == 0                   # everything allocated in the window was freed


def frames(*pairs):
    return [{"filename": f, "line": n, "name": fn} for f, n, fn in pairs]


SNAPSHOT = {
    "segments": [
        {"device": 0, "address": 1000, "total_size": 2 << 20, "stream": 0,
         "segment_type": "large", "allocated_size": 1 << 20, "active_size": 1 << 20,
         "blocks": [{"size": 1 << 20, "requested_size": 1 << 20, "state": "active_allocated",
                     "address": 1000, "frames": []},
                    {"size": 1 << 20, "requested_size": 0, "state": "inactive",
                     "address": 1000 + (1 << 20), "frames": []}]},
        {"device": 0, "address": 9000, "total_size": 2 << 20, "stream": 7,
         "segment_type": "small", "allocated_size": 512, "active_size": 1024,
         "blocks": [{"size": 512, "state": "active_allocated", "frames": []},
                    {"size": 512, "state": "active_pending_free", "frames": []},
                    {"size": (2 << 20) - 1024, "state": "inactive", "frames": []}]},
    ],
    "device_traces": [[
        {"action": "segment_alloc", "addr": 1000, "size": 2 << 20, "stream": 0, "time_us": 1},
        {"action": "alloc", "addr": 1000, "size": 1 << 20, "stream": 0, "time_us": 2,
         "frames": frames(("/x/torch/nn/functional.py", 10, "linear"),
                          ("/home/u/train.py", 42, "forward"))},
        {"action": "alloc", "addr": 5000, "size": 3 << 20, "stream": 0, "time_us": 3,
         "frames": frames(("/home/u/train.py", 50, "step"))},
        {"action": "free_requested", "addr": 5000, "size": 3 << 20, "stream": 0, "time_us": 4},
        {"action": "free_completed", "addr": 5000, "size": 3 << 20, "stream": 0, "time_us": 5},
        {"action": "alloc", "addr": 6000, "size": 1 << 20, "stream": 0, "time_us": 6,
         "frames": []},
    ]],
}


def test_snapshot_history_replays_from_alloc_to_free_completed():
    allocs = snapshot_allocations(SNAPSHOT)
    assert [(x.addr, x.size) for x in allocs] == [(1000, 1 << 20), (5000, 3 << 20),
                                                   (5000, -(3 << 20)), (6000, 1 << 20)]
    r = replay(allocs)
    assert r.peak == 4 << 20 and r.peak_time == pytest.approx(3e-6)
    assert [row["site"] for row in r.by_site()] == ["train.py:50 step", "train.py:42 forward"]
    with pytest.raises(ValueError, match="device_traces"):
        snapshot_allocations(SNAPSHOT, device=3)


def test_allocation_site_skips_torch_and_the_standard_library():
    assert allocation_site([]) == "(no frames)"
    assert allocation_site(frames(("/usr/lib/python3.11/contextlib.py", 1, "f"),
                                  ("/v/lib/python3.11/site-packages/toolkit/m.py", 7, "g"))) \
        == "m.py:7 g"
    only_torch = frames(("/v/site-packages/torch/nn/modules/linear.py", 3, "forward"))
    assert allocation_site(only_torch) == "linear.py:3 forward"


def test_snapshot_state_by_segment_and_in_total():
    rows = segment_table(SNAPSHOT)
    assert [(r["type"], r["stream"], r["blocks"]) for r in rows] == [("large", 0, 2),
                                                                     ("small", 7, 3)]
    assert rows[0]["allocated"] == 1 << 20 and rows[0]["cached free"] == 1 << 20
    assert rows[1]["pending free"] == 512 and rows[1]["largest free block"] == (2 << 20) - 1024
    total = snapshot_summary(SNAPSHOT)
    assert total["segments"] == 2 and total["reserved"] == 4 << 20
    assert total["allocated"] + total["pending free"] + total["cached free"] == total["reserved"]
    assert total["largest free block"] == (2 << 20) - 1024 and total["blocks"] == 5
    # torch's own accounting in the snapshot agrees with the blocks
    assert total["allocated"] == sum(s["allocated_size"] for s in SNAPSHOT["segments"])


def test_memory_timeline_draws_each_replay_with_its_peak():
    r = replay([a(0, 1, 1 << 20, "x"), a(0.001, 1, -(1 << 20))])
    fig = memory_timeline({"rank 0": r, "rank 1": r})
    assert len(fig.data) == 4 and fig.data[0].y[0] == 1.0
    assert "x: 1.00 MiB" in fig.data[1].hovertext[0]
    with pytest.raises(ValueError, match="nothing to draw"):
        memory_timeline({})
