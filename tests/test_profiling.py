"""toolkit.experiments.profiling on 2 gloo ranks: each rank's torch.profiler trace parsed and
merged (events per rank, the bytes of every bucket's all-reduce, the recorder's calls around the
backend's work), and the slow steps of lesson 06's exercises read correctly from their traces;
toolkit.experiments.roofline's measurements on small sizes (structure and counts, never speed).
"""

from __future__ import annotations

import json
import random

import pytest
import torch

from toolkit.data_parallel.buckets import assign_buckets, bucket_cap_bytes
from toolkit.experiments.profiling import (
    DIAGNOSIS_OF, EXERCISE_SETUP, SLOW, VARIANTS, mystery_steps, profile_step, warm_profiler,
)
from toolkit.experiments.roofline import measure_layers, measure_roof, measure_steps
from toolkit.flops import step_flops
from toolkit.models import GPTConfig, TinyMLP, count_parameters
from toolkit.roofline import attention, layernorm, linear
from toolkit.viz.memory_trace import profiler_allocations, replay
from toolkit.viz.overlap import DIAGNOSES, diagnose, symptoms
from toolkit.viz.streams import host_gaps
from toolkit.viz.trace import merge_traces, merged_chrome_trace

TIMEOUT = 60


@pytest.fixture(scope="module", autouse=True)
def warm():
    warm_profiler()  # once, before the first fork: ranks inherit an initialised profiler


def bucket_bytes(width: int, depth: int, cap_mb: float) -> list[int]:
    params = list(TinyMLP(d_in=width, d_hidden=width, d_out=width, depth=depth).parameters())
    return sorted(4 * sum(params[i].numel() for i in b)
                  for b in assign_buckets(params, bucket_cap_bytes(cap_mb)))


def test_overlapped_step_traces_merge_with_every_bucket_on_every_rank(tmp_path):
    run = profile_step("overlapped", folder=tmp_path, world_size=2, timeout=TIMEOUT)
    assert [p.name for p in run.paths] == ["overlapped-rank0.json", "overlapped-rank1.json"]
    spans = merge_traces(run.traces)
    assert {s.rank for s in spans} == {0, 1}
    want = bucket_bytes(256, 4, 0.25)
    assert run.buckets == len(want) == 5
    for rank in (0, 1):
        comm = [s for s in spans if s.rank == rank and s.kind == "comm"]
        assert sorted(s.nbytes for s in comm) == want          # one gloo:all_reduce per bucket
        assert {s.name for s in comm} == {"gloo:all_reduce"}
        launches = [s for s in spans if s.rank == rank and s.kind == "launch"]
        assert len(launches) == len(want)
        assert not {s.thread for s in comm} & {s.thread for s in launches}  # gloo's own threads
        assert symptoms(spans, rank=rank)["early_launches"] >= 1   # launched during backward
        assert diagnose(spans, rank=rank) == "no bottleneck found"
        # The recorder sees the same all-reduces, each from its Python call to its wait: around
        # the backend's work (up to the two clocks' agreement).
        rec = sorted((e for e in run.recorded if e.rank == rank and e.op == "all_reduce"),
                     key=lambda e: e.start)
        assert [e.nbytes for e in rec] == [s.nbytes for s in sorted(comm, key=lambda s: s.start)]
        for e, s in zip(rec, sorted(comm, key=lambda s: s.start)):
            assert e.start - 2e-3 <= s.start and s.end <= e.end + 2e-3
        assert [label for label, _, _ in run.compute[rank]] == [
            f"layer {i} backward" for i in reversed(range(5))]
    merged = merged_chrome_trace(run.traces)
    complete = sum(e.get("ph") == "X" and e.get("cat") != "Trace"
                   for t in run.traces for e in t["traceEvents"])
    assert sum(e.get("ph") == "X" for e in merged["traceEvents"]) == complete
    json.dumps(merged)


def test_torch_ddp_is_invisible_to_the_recorder_but_not_to_the_profiler(tmp_path):
    run = profile_step("torch", folder=tmp_path, world_size=2, timeout=TIMEOUT)
    assert run.buckets is None
    assert not [e for e in run.recorded if e.op == "all_reduce"]   # its C++ reducer calls gloo
    spans = merge_traces(run.traces)
    grads = 4 * count_parameters(TinyMLP(d_in=256, d_hidden=256, d_out=256, depth=4))
    for rank in (0, 1):
        reduced = [s for s in spans if s.rank == rank and s.name == "gloo:all_reduce"]
        assert reduced and sum(s.nbytes for s in reduced) == grads


@pytest.mark.parametrize("variant", SLOW)
def test_each_slow_step_is_read_from_its_trace(tmp_path, variant):
    run = profile_step(variant, folder=tmp_path, world_size=2, timeout=TIMEOUT, **EXERCISE_SETUP)
    spans = merge_traces(run.traces)
    for rank in (0, 1):
        assert diagnose(spans, rank=rank) == DIAGNOSIS_OF[variant]
    s = symptoms(spans, rank=0)
    if variant == "copy in a loop":                  # a copy per sample, of inputs and targets
        assert s["copies"] >= 2 * EXERCISE_SETUP["batch"]
    if variant == "small buckets":
        assert s["collectives"] == s["grad_tensors"] == 14 == run.buckets
    if variant == "blocking":
        assert s["early_launches"] == 0 and s["collectives"] == run.buckets == 2


def test_the_exercise_baseline_reads_clean_and_the_mystery_is_a_permutation(tmp_path):
    run = profile_step("overlapped", folder=tmp_path, world_size=2, timeout=TIMEOUT,
                       **EXERCISE_SETUP)
    assert diagnose(merge_traces(run.traces)) == "no bottleneck found" and run.buckets == 2
    assert set(DIAGNOSIS_OF) == set(SLOW) and set(DIAGNOSIS_OF.values()) < set(DIAGNOSES)
    assert set(VARIANTS) >= set(SLOW)
    steps = mystery_steps(folder=tmp_path, seed=0, timeout=TIMEOUT)
    assert list(steps) == list("ABC")
    # Nothing but the traces tells which is which: not the variant, not the files' names.
    assert [v.variant for v in steps.values()] == ["mystery A", "mystery B", "mystery C"]
    assert all(p.name.startswith(f"mystery-{k}-") for k, v in steps.items() for p in v.paths)
    assert [diagnose(merge_traces(v.traces)) for v in steps.values()] == [
        DIAGNOSIS_OF[v] for v in random.Random(0).sample(SLOW, k=3)]


def test_memory_of_a_step_on_every_rank_from_the_profilers_events(tmp_path):
    run = profile_step("overlapped", folder=tmp_path, world_size=2, timeout=TIMEOUT,
                       profile_memory=True, label="memory")
    assert run.devices == ["cpu", "cpu"] and run.snapshots is None   # snapshots are CUDA's
    assert [p.name for p in run.paths] == ["memory-rank0.json", "memory-rank1.json"]
    width, batch, depth = 256, 512, 4
    activation = 4 * batch * width                                  # one (512, 256) fp32 tensor
    for trace in run.traces:
        r = replay(profiler_allocations(trace))
        sites = {row["site"]: row for row in r.by_site()}
        # At the peak every hidden layer's ReLU output is still held for backward, and the
        # batch (inputs and targets) copied in "data to device".
        relu = sites["forward · aten::clamp_min"]
        assert relu["bytes"] == depth * activation and relu["blocks"] == depth
        assert sites["data to device · aten::empty_strided"]["bytes"] == 2 * activation
        assert r.peak >= (depth + 2) * activation and r.unmatched_free == 0
        # The step ends holding exactly the gradients it made (weights' from aten::mm,
        # biases' from aten::sum): activations and the batch are gone.
        grads = 4 * count_parameters(TinyMLP(d_in=width, d_hidden=width, d_out=width,
                                             depth=depth))
        assert r.live[-1] == grads < r.peak
    gaps = host_gaps(merge_traces(run.traces), rank=0)
    assert gaps and all(g["gap"] > 0 for g in gaps)


def test_profile_step_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="variant must be one of"):
        profile_step("fast", folder=tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        profile_step("overlapped", folder=tmp_path / "missing")
    with pytest.raises(ValueError, match="cap_mb"):
        profile_step("overlapped", folder=tmp_path, cap_mb=0)
    with pytest.raises(ValueError, match="backend must be"):
        profile_step("overlapped", folder=tmp_path, backend="mpi")


def test_measure_roof_layers_and_steps_report_their_counts():
    roof, rows = measure_roof(sizes=(64, 128), stream_mib=2, trials=3)
    assert roof.peak_flops == max(r["core FLOP/s"] for r in rows if r["what"] == "peak FLOP/s")
    assert roof.bandwidth == max(r["core B/s"] for r in rows if r["what"] == "bandwidth")
    mm = [r for r in rows if r["what"] == "peak FLOP/s"]
    assert [r["intensity"] for r in mm] == [64 / 6, 128 / 6]        # 2n³ / (3·4·n²)
    assert [r["bytes"] for r in rows if r["what"] == "bandwidth"] == [2 * 2**21, 3 * 2**21]
    for r in rows:                                  # one thread: its CPU time ≤ the wall time
        assert r["core s"] <= r["wall s"] * 1.01 + 1e-5
    cfg = GPTConfig(vocab_size=32, seq_len=8, d_model=32, n_head=4, n_layer=1)
    layers = measure_layers(cfg, (1, 2), trials=3)
    assert [(r["micro_batch"], r["kernel"]) for r in layers] == [
        (b, k) for b in (1, 2) for k in ("ln_1", "up_proj", "attention")]
    by = {(r["micro_batch"], r["kernel"]): r for r in layers}
    assert by[(2, "up_proj")]["flops"] == linear(16, 32, 128).flops
    assert by[(2, "attention")]["bytes"] == attention(2, 8, 32, 4).bytes
    assert by[(1, "ln_1")]["intensity"] == layernorm(8, 32).intensity
    steps = measure_steps(cfg, (1, 3), trials=2)
    assert [r["flops"] for r in steps] == [step_flops(cfg, b)["model"] for b in (1, 3)]
    assert all(r["wall FLOP/s"] > 0 and r["core FLOP/s"] > 0 for r in steps)
    assert torch.get_num_threads() >= 1
