"""`make gpu-check` (benchmarks/gpu_check.py): stops at once without a GPU, plans one GPU as the
shared placement and several as NCCL, and every step and the results folder work, rehearsed on
the CPU (``--device cpu --quick``)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from autograder.sandbox.rank import load_module
from toolkit.cost.results import (
    find_device_figures,
    find_results,
    load_device_figures,
    load_results,
)
from toolkit.launch import gpu_count

ROOT = Path(__file__).resolve().parents[1]
STEPS = ["environment", "GPU", "GPU", "grading", "collectives", "DDP", "FSDP", "lessons"]


def _gpu_check():
    return load_module(ROOT / "benchmarks" / "gpu_check.py", "gpu_check")


@pytest.mark.skipif(gpu_count() > 0, reason="this machine has a GPU: gpu-check would run")
def test_without_a_gpu_it_stops_before_starting_anything(tmp_path, capsys):
    out = tmp_path / "results"
    assert _gpu_check().main(["--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "make gpu-check needs a GPU" in err and f"sees {gpu_count()} GPU(s)" in err
    assert "--device cpu --quick" in err
    assert not out.exists()


def test_one_gpu_shares_it_and_several_run_nccl(monkeypatch):
    gpu_check = _gpu_check()
    monkeypatch.setattr(gpu_check, "gpu_count", lambda: 1)
    one = gpu_check.Plan.for_machine()
    assert (one.device, one.placement, one.worlds) == ("cuda", "shared", [2])
    monkeypatch.setattr(gpu_check, "gpu_count", lambda: 8)
    monkeypatch.setattr("torch.distributed.is_nccl_available", lambda: True)
    eight = gpu_check.Plan.for_machine()
    assert (eight.placement, eight.worlds) == ("gpu", [2, 4, 8])
    assert gpu_check.Plan.for_machine("cpu").placement == "cpu"


def test_the_dry_run_lists_every_step_within_its_budget(tmp_path, capsys):
    assert _gpu_check().main(["--device", "cpu", "--dry-run", "--out", str(tmp_path / "x")]) == 0
    printed = capsys.readouterr().out
    lines = [line for line in printed.splitlines() if line.startswith("[")]
    assert [line.split("] ")[1].split()[0] for line in lines] == STEPS
    caps = [int(line.split("at most ")[1].split()[0]) for line in lines]
    assert all(cap <= 480 for cap in caps) and not (tmp_path / "x").exists()


@pytest.mark.slow
@pytest.mark.multirank
def test_rehearsal_on_the_cpu_writes_the_results_folder_lessons_read(tmp_path, capsys):
    out = tmp_path / "rehearsal"
    code = _gpu_check().main(["--device", "cpu", "--quick", "--lessons", "00", "--budget", "900",
                              "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed[-4000:]
    summary = (out / "summary.txt").read_text().splitlines()
    assert [line.split()[0] for line in summary] == STEPS
    assert all(" ok " in line for line in summary) and "gpu-check summary:" in printed
    env = json.loads((out / "environment.json").read_text())
    assert env["driver_live_before"] is False and env["placement"] == "cpu"
    assert [s["sum"] for s in env["smoke"]] == [3.0, 3.0]
    figures = load_device_figures(out)  # what lessons 06 and 09 will read
    assert figures.name == "cpu" and figures.peak_tflops("fp32") > 0
    assert figures.bandwidth("h2h", "pageable") > 0 and find_device_figures(tmp_path) == [out]
    table, meta = load_results(out)  # what lessons 03 and 04 load
    assert meta["backend"] == "gloo" and meta["placement"] == "cpu"
    assert set(table.algorithm) == {"ring", "tree", "ps", "sharded_ps", "torch"}
    assert find_results(tmp_path) == [out]
    grade = json.loads((out / "grades" / "01_collectives-cpu.json").read_text())
    assert grade["score"] == 100
    with open(out / "ddp_step.csv") as f:
        ddp = list(csv.DictReader(f))
    assert [r["variant"] for r in ddp] == ["torch DDP", "naive", "bucketed", "overlapped"]
    assert all(float(r["2 ranks (ms)"]) > 0 for r in ddp)
    with open(out / "fsdp_step.csv") as f:
        assert [r["variant"] for r in csv.DictReader(f)] == ["torch FSDP2", "ours",
                                                             "ours + prefetch"]
    with open(out / "lessons.csv") as f:
        assert [(r["lesson"], r["status"]) for r in csv.DictReader(f)] == [
            ("00_getting_started.ipynb", "ok")]
    executed = json.loads((out / "lessons" / "00_getting_started.ipynb").read_text())
    assert any(c.get("outputs") for c in executed["cells"] if c["cell_type"] == "code")
    assert "skipped" in (out / "pytest.txt").read_text()  # no GPU here: every GPU test skips
