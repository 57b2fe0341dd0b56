"""Grading on GPUs (issues 18, 29): every lab that runs on cuda grades its reference at 100 on
the GPUs there are (a GPU per rank with 4, else the ranks share them), a few faults cost what
they cost on CPU, and batch gives concurrent grades disjoint GPU sets (that one needs 2 GPUs).
Skipped without a GPU. The device planning and its errors run everywhere:
tests/test_autograder_devices.py."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from faultkit import ROOT, assert_failed, assert_passed, run_fault, run_grade

from autograder.batch import run_batch
from autograder.devices import gpu_sets, visible_gpus
from autograder.lab import find_lab, load_lab
from toolkit.launch import gpu_count

LABS = sorted(p.parent for p in (ROOT / "labs").glob("*/checks.py"))
NEEDED = 4

pytestmark = [pytest.mark.gpu, pytest.mark.multirank, pytest.mark.slow,
              pytest.mark.skipif(gpu_count() < 1, reason="needs a CUDA GPU")]


def _gpus() -> list[int]:
    """One GPU per rank of the largest launch where there are enough; else all there are."""
    return visible_gpus()[:NEEDED]


def _student(lab) -> Path:
    return lab.path / lab.info.student_files[0]


@pytest.mark.parametrize("lab_dir", LABS, ids=[p.name for p in LABS])
def test_reference_scores_full_marks_on_gpus(lab_dir, tmp_path):
    lab = load_lab(lab_dir)
    if "cuda" not in lab.info.devices:
        pytest.skip(f"{lab_dir.name} runs on {lab.info.devices} only")
    result, _ = run_grade(lab, _student(lab), tmp_path, device="cuda", gpus=_gpus())
    assert [(c.check.name, c.message) for c in result.checks if not c.ok] == []
    assert result.score == result.max_score == 100


@pytest.mark.parametrize("fault, kind", [("mistake_averaged", "wrong_result"),
                                         ("deadlock_blocking_ring", "deadlock"),
                                         ("builtin_all_reduce", "builtin_collective")])
def test_faults_cost_the_same_on_gpus(fault, kind, tmp_path):
    lab01 = load_lab(find_lab("01_collectives"), hidden=False)
    result, by_name = run_fault(lab01, fault, ["ar", "tree"], tmp_path,
                                hang={"ar"} if kind == "deadlock" else set(), device="cuda",
                                gpus=_gpus())
    assert_failed(by_name["ar"], kind)
    assert_passed(by_name["tree"])


@pytest.mark.skipif(gpu_count() < 2, reason="disjoint GPU sets need 2 GPUs")
def test_batch_gives_concurrent_grades_disjoint_gpu_sets(tmp_path):
    subs = tmp_path / "subs"
    for k in range(3):
        (subs / f"s{k}").mkdir(parents=True)
        (subs / f"s{k}" / "collectives.py").write_text(
            (ROOT / "labs" / "01_collectives" / "collectives.py").read_text())
    gpus = visible_gpus()
    sets = gpu_sets(gpus, per_grade=min(NEEDED, len(gpus) // 2), jobs=2)
    assert len(sets) == 2 and not set(sets[0]) & set(sets[1])
    rows = run_batch(subs, find_lab("01_collectives"), tmp_path / "out", jobs=2,
                     device="cuda", gpu_sets=sets)
    assert [float(r["score"]) for r in rows] == [100.0] * 3
    with open(tmp_path / "out" / "summary.csv") as f:
        assert len(list(csv.DictReader(f))) == 3
