"""toolkit.viz.streams: a GPU trace's kernels per stream, NCCL kernels, idle gaps charged to
launches or dependencies (synthetic traces shaped as Kineto writes them: kernels on pid =
device, tid = stream, paired with their host launch by ``correlation``), and the host's gaps
between operators on a CPU rank (a real two-rank profile in test_profiling.py)."""

from __future__ import annotations

import pytest

from toolkit.viz.streams import (
    device_gaps, device_ops, device_overlap, gap_summary, host_gaps, idle_gaps, is_nccl,
    stream_table, stream_timeline,
)
from toolkit.viz.trace import spans

NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def kernel(name, ts, dur, corr, *, stream=7, device=0, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "pid": device, "tid": stream, "ts": ts,
            "dur": dur, "args": {"device": device, "stream": stream, "correlation": corr,
                                 "grid": [1, 1, 1], "block": [128, 1, 1]}}


def launch(ts, dur, corr, name="cudaLaunchKernel", cat="cuda_runtime"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 4242, "tid": 4242, "ts": ts, "dur": dur,
            "args": {"cbid": 211, "correlation": corr}}


def gpu_trace(rank=0):
    # Host launches gemm A (µs 0-5), B (5-10); kernel A runs 10-20, B 20-30 (queued: no gap).
    # Then the host is late: launch C at 40-45, C runs 46-50 (gap 30-46: launch).
    # NCCL kernel on stream 20 queued at 12, runs 25-60; D launched at 50, waits for it (a
    # stream wait), runs 62-70 (gap 60-62: dependency). A memcpy on stream 7 at 70-72.
    events = [
        launch(0, 5, 1), launch(5, 5, 2), launch(12, 3, 3, name="cudaLaunchKernelExC"),
        launch(40, 5, 4), launch(50, 2, 5, name="cuLaunchKernel", cat="cuda_driver"),
        launch(52, 3, 6, name="cudaMemcpyAsync"),
        kernel("gemm_A", 10, 10, 1), kernel("gemm_B", 20, 10, 2),
        kernel(NCCL, 25, 35, 3, stream=20), kernel("relu_C", 46, 4, 4),
        kernel("gemm_D", 62, 8, 5), kernel("Memcpy DtoH (Device -> Pageable)", 70, 2, 6,
                                           cat="gpu_memcpy"),
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 4242, "tid": 4242, "ts": 0,
         "dur": 4},
        {"ph": "s", "id": 1, "pid": 4242, "tid": 4242, "ts": 0, "cat": "ac2g", "name": "ac2g"},
    ]
    return {"distributedInfo": {"rank": rank, "world_size": 2}, "baseTimeNanoseconds": 0,
            "traceEvents": events}


def test_device_ops_pair_each_kernel_with_its_launch_and_name_nccl():
    ops = device_ops(gpu_trace())
    assert [o.name[:6] for o in ops] == ["gemm_A", "gemm_B", "ncclDe", "relu_C", "gemm_D",
                                         "Memcpy"]
    assert [o.kind for o in ops] == ["compute", "compute", "comm", "compute", "compute", "copy"]
    assert ops[2].stream == 20 and ops[2].launch == "cudaLaunchKernelExC"
    assert ops[4].launch == "cuLaunchKernel"                      # driver API launches too
    assert ops[0].start == pytest.approx(10e-6) and ops[0].launch_end == pytest.approx(5e-6)
    assert is_nccl("ncclKernel_AllReduce_RING_LL_Sum_float") and not is_nccl("gemm")
    assert device_ops({"distributedInfo": {"rank": 0}, "traceEvents": []}) == []


def test_stream_table_counts_per_stream():
    rows = stream_table(device_ops(gpu_trace()))
    assert [(r["stream"], r["kernels"], r["nccl kernels"], r["copies"]) for r in rows] == [
        (7, 4, 0, 1), (20, 1, 1, 0)]
    assert rows[0]["busy"] == pytest.approx((10 + 10 + 4 + 8 + 2) * 1e-6)
    assert rows[1]["most frequent"] == NCCL


def test_device_gaps_are_charged_to_late_launches_or_dependencies():
    gaps = device_gaps(device_ops(gpu_trace()), rank=0)
    # busy 10-60 (the NCCL kernel covers 25-60, so relu_C's gap at 30-46 is no device gap),
    # then gemm_D at 62: launched at 50-52, before the device went idle at 60 -> dependency
    assert [(round(g["start"] * 1e6), round(g["gap"] * 1e6), g["cause"]) for g in gaps] == [
        (60, 2, "dependency")]
    # Without the NCCL kernel the device idles 30-46 waiting for a launch that ended at 45 > 30
    ops = [o for o in device_ops(gpu_trace()) if o.kind != "comm"]
    gaps = device_gaps(ops, rank=0)
    assert [(round(g["start"] * 1e6), round(g["gap"] * 1e6), g["cause"], g["before"])
            for g in gaps] == [(30, 16, "launch", "relu_C"), (50, 12, "launch", "gemm_D")]
    summary = gap_summary(gaps, window=62e-6)
    assert summary["gaps"] == 2 and summary["idle (launch)"] == pytest.approx(28e-6)
    assert summary["idle share"] == pytest.approx(28 / 62)
    assert device_gaps(ops, rank=0, min_gap=13e-6)[0]["gap"] == pytest.approx(16e-6)
    with pytest.raises(ValueError, match="window"):
        gap_summary(gaps, window=0)


def test_an_untraced_launch_is_unknown_and_two_devices_need_a_choice():
    t = gpu_trace()
    t["traceEvents"] = [e for e in t["traceEvents"] if e.get("cat") != "cuda_runtime"]
    ops = [o for o in device_ops(t) if o.kind != "comm"]      # gemm_D's driver launch stays
    assert [g["cause"] for g in device_gaps(ops, rank=0)] == ["unknown", "launch"]
    t2 = gpu_trace()
    t2["traceEvents"].append(kernel("other_gpu", 0, 1, 99, device=1))
    with pytest.raises(ValueError, match="pass device="):
        device_gaps(device_ops(t2), rank=0)
    assert device_gaps(device_ops(t2), rank=0, device=1) == []


def test_device_overlap_reads_nccl_under_compute():
    row = device_overlap(device_ops(gpu_trace()))[0]
    # NCCL 25-60 under compute 25-30 (gemm_B) and 46-50 (relu_C): 9 µs hidden of 35
    assert row["comm"] == pytest.approx(35e-6) and row["hidden"] == pytest.approx(9e-6)
    assert row["nccl kernels"] == 1 and row["compute kernels"] == 4


def test_idle_gaps_within_a_window():
    assert idle_gaps([(2, 3), (0, 1), (2.5, 4)]) == [(1, 2)]
    assert idle_gaps([(2, 3)], window=(0, 5)) == [(0, 2), (3, 5)]
    assert idle_gaps([], window=(0, 1)) == [(0, 1)]


def test_host_gaps_between_top_level_operators_on_the_main_thread():
    def x(name, ts, dur, tid=1):
        return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts,
                "dur": dur}
    t = {"distributedInfo": {"rank": 3}, "baseTimeNanoseconds": 0, "traceEvents": [
        x("aten::linear", 0, 10), x("aten::addmm", 1, 8), x("c10d::allreduce_", 15, 5),
        x("aten::mm", 30, 10), x("aten::mm", 0, 100, tid=2)]}
    gaps = host_gaps(spans(t), rank=3)
    assert [(round(g["gap"] * 1e6), g["after"], g["before"]) for g in gaps] == [
        (5, "aten::linear", "c10d::allreduce_"), (10, "c10d::allreduce_", "aten::mm")]
    assert gaps[0]["thread"] == "1/1"
    with pytest.raises(ValueError, match="no top-level"):
        host_gaps(spans(t), rank=0)


def test_stream_timeline_has_a_row_per_stream_and_the_gaps():
    ops = [o for o in device_ops(gpu_trace()) if o.kind != "comm"]
    fig = stream_timeline(device_ops(gpu_trace()), gaps={0: device_gaps(ops, rank=0)})
    assert [tr.y[0] for tr in fig.data] == ["rank 0 · stream 7", "rank 0 · stream 20",
                                            "rank 0 · idle"]
    with pytest.raises(ValueError, match="no device ops"):
        stream_timeline([])
