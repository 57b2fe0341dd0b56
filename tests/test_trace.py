"""toolkit.viz.trace and toolkit.viz.overlap: torch.profiler's Chrome traces parsed (a real
profile of this process, and hand-made traces with known answers), intervals, overlap, and the
exposed time of lesson 06's exercise."""

from __future__ import annotations

import json
import time

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from toolkit.comm.events import Event
from toolkit.viz.overlap import (
    diagnose, exposed_time, overlap, overlap_table, recorded_overlap_table, symptoms, union,
)
from toolkit.viz.profiler import profile_timeline
from toolkit.viz.trace import (
    classify, merge_traces, merged_chrome_trace, op_table, read_trace, spans, trace_rank,
)


def x(name, ts, dur, *, tid=1, cat="cpu_op", pid=7, **args):
    """A complete event of a hand-made trace (µs)."""
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "args": args}


def trace(rank, events, base_ns=1_000_000_000_000_000_000):
    return {"distributedInfo": {"rank": rank, "world_size": 2}, "baseTimeNanoseconds": base_ns,
            "traceEvents": [{"ph": "M", "name": "process_name", "pid": 7, "tid": 0,
                             "args": {"name": "python"}}, *events]}


STEP = [  # one rank's step: forward linear, backward mm, an all-reduce on gloo's thread
    x("forward", 0, 100, cat="user_annotation"),
    x("aten::linear", 10, 30), x("aten::addmm", 12, 25), x("aten::copy_", 14, 5),
    x("c10d::allreduce_", 50, 2),
    x("aten::mm", 60, 20),
    x("gloo:all_reduce", 52, 40, tid=2, cat="user_annotation",
      **{"Input Dims": [[16, 4]], "Input type": ["float"]}),
    x("PyTorch Profiler (0)", 0, 200, cat="Trace", tid="PyTorch Profiler"),
]


def test_hand_made_trace_parses_to_kinds_parents_depths_and_self_times():
    got = {s.name: s for s in spans(trace(0, STEP))}
    assert "PyTorch Profiler (0)" not in got                     # the profiler's own bracket
    assert {n: s.kind for n, s in got.items()} == {
        "forward": "other", "aten::linear": "compute", "aten::addmm": "compute",
        "aten::copy_": "compute", "c10d::allreduce_": "launch", "aten::mm": "compute",
        "gloo:all_reduce": "comm"}
    assert got["aten::addmm"].parent == "aten::linear" and got["aten::addmm"].depth == 1
    assert got["aten::linear"].parent is None and got["aten::linear"].depth == 0
    assert got["aten::copy_"].depth == 2
    assert got["aten::linear"].self_time == pytest.approx(5e-6)   # 30 − 25 µs in addmm
    assert got["aten::addmm"].self_time == pytest.approx(20e-6)
    assert got["gloo:all_reduce"].nbytes == 16 * 4 * 4 and got["aten::mm"].nbytes == 0
    assert got["aten::mm"].start == pytest.approx(1e9 + 60e-6)    # base + ts, in seconds
    assert got["gloo:all_reduce"].thread != got["aten::mm"].thread


def test_classify_names_gpu_events_too():
    assert classify("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "kernel") == "comm"
    assert classify("nccl:all_reduce", "user_annotation") == "comm"
    assert classify("ampere_sgemm_128x64_nn", "kernel") == "compute"
    assert classify("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy") == "copy"
    assert classify("record_param_comms", "cpu_op") == "launch"
    assert classify("autograd::engine::evaluate_function: MmBackward0", "cpu_op") == "other"


def test_union_and_overlap_by_hand():
    assert union([(3, 4), (0, 2), (1, 2.5), (4, 5)]) == [(0, 2.5), (3, 5)]
    o = overlap([(0, 10), (5, 15)], [(2, 4), (12, 20)])
    assert o == {"comm": 15, "compute": 10, "hidden": 5, "exposed": 10,
                 "hidden_fraction": pytest.approx(1 / 3)}
    assert overlap([], [(0, 1)])["hidden_fraction"] == 0.0
    assert exposed_time([(0, 1)], [(0, 1)]) == 0 and exposed_time([(0, 1)], []) == 1
    with pytest.raises(ValueError, match="ends before it starts"):
        union([(2, 1)])


def test_overlap_table_and_symptoms_of_the_hand_made_step():
    sp = spans(trace(0, STEP))
    (row,) = overlap_table(sp)
    # comm 52..92 µs; compute (ATen ops) 10..40 and 60..80: 20 µs hidden. (Epoch seconds as
    # floats resolve ~0.24 µs at 1e9 s.)
    assert row["comm"] == pytest.approx(40e-6, abs=1e-6)
    assert row["hidden"] == pytest.approx(20e-6, abs=1e-6)
    assert row["collectives"] == 1
    s = symptoms(sp)
    assert s["early_launches"] == 1 and s["collectives"] == 1 and s["copies"] == 0
    assert diagnose(sp) == "no bottleneck found"
    late = [e for e in STEP if e["name"] != "aten::mm"] + [x("aten::mm", 30, 5, tid=1)]
    assert diagnose(spans(trace(0, late))) == "blocking all-reduce"    # launched after the mm
    loop = STEP + [x("aten::to", 200 + i, 1) for i in range(64)]
    assert symptoms(spans(trace(0, loop)))["copies"] == 64
    assert diagnose(spans(trace(0, loop))) == "copy in a loop"
    grads = STEP + [x("torch::autograd::AccumulateGrad", 95 + i, 1) for i in (0, 2)]
    assert diagnose(spans(trace(0, grads))) == "no bottleneck found"   # 2 grads, 1 all-reduce
    grads.append(x("gloo:all_reduce", 100, 5, tid=2, cat="user_annotation"))
    assert diagnose(spans(trace(0, grads))) == "bucket cap too small"  # 1 all-reduce per grad


def test_merge_puts_ranks_on_one_clock_and_refuses_a_rank_twice():
    later = trace(1, STEP, base_ns=1_000_000_001_000_000_000)        # one second later
    merged = merge_traces([trace(0, STEP), later])
    assert {s.rank for s in merged} == {0, 1}
    first = {s.rank: s.start for s in merged if s.name == "aten::mm"}
    assert first[1] - first[0] == pytest.approx(1.0)
    assert [s.start for s in merged] == sorted(s.start for s in merged)
    with pytest.raises(ValueError, match="two traces of rank 0"):
        merge_traces([trace(0, STEP), trace(0, STEP)])
    with pytest.raises(ValueError, match="no distributedInfo"):
        trace_rank({"traceEvents": []})
    chrome = merged_chrome_trace([trace(0, STEP), later])
    names = {e["pid"]: e["args"]["name"] for e in chrome["traceEvents"]
             if e.get("name") == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1"}
    mm = sorted(e["ts"] for e in chrome["traceEvents"] if e.get("name") == "aten::mm")
    assert mm == pytest.approx([60.0, 60.0 + 1e6])                   # µs from a common origin
    assert not any(e.get("cat") == "Trace" for e in chrome["traceEvents"])


def test_a_real_profile_of_this_process_parses(tmp_path):
    lin = torch.nn.Linear(64, 32)
    inp = torch.randn(128, 64)
    before = time.time()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        lin(inp).sum().backward()
        inp.clone()
    after = time.time()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    tr = read_trace(path)
    sp = spans(tr, rank=0)
    names = {s.name for s in sp}
    assert {"aten::linear", "aten::addmm", "aten::mm", "aten::clone"} <= names
    addmm = next(s for s in sp if s.name == "aten::addmm")
    assert addmm.parent == "aten::linear" and addmm.kind == "compute"
    # The profiler's clock is time.time()'s: every span lies inside the block (±5 ms).
    assert all(before - 5e-3 <= s.start <= s.end <= after + 5e-3 for s in sp)
    assert all(0 <= s.self_time <= s.duration + 1e-6 for s in sp)
    table = {r["name"]: r for r in op_table(sp)}
    assert table["aten::clone"]["top-level calls"] == 1 and table["aten::mm"]["calls"] >= 1
    with pytest.raises(ValueError, match="no distributedInfo"):
        spans(tr)                                   # no process group: say the rank
    (tmp_path / "bad.json").write_text(json.dumps({"events": []}))
    with pytest.raises(ValueError, match="not a Chrome trace"):
        read_trace(tmp_path / "bad.json")


def test_recorded_overlap_table_reads_lesson_04s_view():
    events = [Event(rank=0, seq=0, op="all_reduce", peer=None, nbytes=8, dtype="float32",
                    shape=(2,), start=1.0, end=3.0, async_op=True),
              Event(rank=0, seq=1, op="broadcast", peer=0, nbytes=8, dtype="float32",
                    shape=(2,), start=0.0, end=0.5)]
    (row,) = recorded_overlap_table(events, {0: [("layer 1", 0.0, 2.0), ("layer 0", 2.0, 2.5)]})
    assert row["comm"] == 2.0 and row["hidden"] == 1.5 and row["exposed"] == 0.5
    assert row["collectives"] == 1                  # all-reduces only


def test_profile_timeline_has_rows_per_rank_and_one_bar_per_outer_op():
    later = trace(1, STEP, base_ns=1_000_000_000_000_100_000)
    sp = merge_traces([trace(0, STEP), later])
    rec = [Event(rank=1, seq=0, op="all_reduce", peer=None, nbytes=256, dtype="float32",
                 shape=(64,), start=1e9 + 40e-6, end=1e9 + 100e-6)]
    fig = profile_timeline(sp, recorded=rec)
    rows = list(fig.layout.yaxis.categoryarray)[::-1]
    assert rows == ["rank 0 compute", "rank 0 comm (profiler)", "rank 0 comm (recorder)",
                    "rank 1 compute", "rank 1 comm (profiler)", "rank 1 comm (recorder)"]
    bars = {(t.y[0] if len(t.y) else None): t for t in fig.data}
    assert list(bars["rank 0 compute"].customdata) == ["aten::linear", "aten::mm"]   # outermost
    assert list(bars["rank 1 comm (recorder)"].x) == pytest.approx([0.06], abs=1e-3)  # ms
    with pytest.raises(ValueError, match="nothing to draw"):
        profile_timeline([])
