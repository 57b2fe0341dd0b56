"""`make gpu-check` (benchmarks/gpu_check.py): stops at once without GPUs, and its steps and
results folder work, rehearsed on gloo."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from autograder.sandbox.rank import load_module
from toolkit.cost.results import find_results, load_results
from toolkit.launch import gpu_count

ROOT = Path(__file__).resolve().parents[1]


def _gpu_check():
    return load_module(ROOT / "benchmarks" / "gpu_check.py", "gpu_check")


@pytest.mark.skipif(gpu_count() >= 2, reason="this machine has GPUs: gpu-check would run")
def test_without_gpus_it_stops_before_starting_anything(tmp_path, capsys):
    out = tmp_path / "results"
    assert _gpu_check().main(["--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "needs a CUDA build of torch with NCCL and at least 2 GPUs" in err
    assert "sees 0 GPU(s)" in err and "--backend gloo" in err
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.multirank
def test_rehearsal_on_gloo_writes_the_results_folder_lessons_read(tmp_path, capsys):
    out = tmp_path / "rehearsal"
    code = _gpu_check().main(["--backend", "gloo", "--quick", "--lessons", "00", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed[-3000:]
    summary = (out / "summary.txt").read_text().splitlines()
    assert [line.split()[0] for line in summary] == ["GPU", "collectives", "DDP", "FSDP", "lessons"]
    assert all(" ok " in line for line in summary) and "gpu-check summary:" in printed
    table, meta = load_results(out)  # what lessons 03 and 04 load
    assert meta["backend"] == "gloo" and set(table.algorithm) == {"ring", "tree", "ps",
                                                                  "sharded_ps", "torch"}
    assert find_results(tmp_path) == [out]
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
