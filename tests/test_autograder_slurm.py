"""autograder/slurm.py without a cluster: the split, the job script, the gathering (a lost task
included) and the CLI's errors. tests/test_slurm.py runs the real thing on a one-node cluster."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from autograder import slurm
from autograder.cli import main


def test_split_is_round_robin_and_never_leaves_a_task_empty():
    subs = [Path(n) for n in "abcde"]
    assert slurm.split(subs, 2) == [[Path("a"), Path("c"), Path("e")], [Path("b"), Path("d")]]
    assert slurm.split(subs, 9) == [[p] for p in subs]
    with pytest.raises(ValueError, match="TASKS must be an int >= 1"):
        slurm.split(subs, 0)


def test_job_script_runs_the_ordinary_batch_command_per_array_task(tmp_path):
    text = slurm.job_script(out=tmp_path / "graded", lab_dir=Path("/labs/01_collectives"),
                            tasks=3, jobs=2)
    assert text.startswith("#!/bin/bash\n") and "#SBATCH --array=0-2" in text
    assert f"#SBATCH --output={tmp_path}/graded/slurm/task-%a.out" in text
    run = text.strip().splitlines()[-1]
    assert "-m autograder batch" in run and "--lab /labs/01_collectives --jobs 2" in run
    assert f'"{tmp_path}/graded/slurm/parts/$SLURM_ARRAY_TASK_ID"' in run


def test_job_script_asks_for_gpus_and_passes_the_device_on(tmp_path):
    text = slurm.job_script(out=tmp_path / "g", lab_dir=Path("/labs/02_ddp"), tasks=2, jobs=2,
                            device="cuda", gpus_per_grade=4)
    assert "#SBATCH --gres=gpu:8" in text  # two grades at once, four GPUs each, per task
    assert "--jobs 2 --device cuda --gpus-per-grade 4 --out" in text.strip().splitlines()[-1]
    cpu = slurm.job_script(out=tmp_path / "g", lab_dir=Path("/labs/02_ddp"), tasks=2, jobs=2)
    assert "--gres" not in cpu and "--device" not in cpu
    with pytest.raises(ValueError, match="gpus_per_grade must be an int >= 1"):
        slurm.job_script(out=tmp_path, lab_dir=Path("/l"), tasks=1, jobs=1, device="cuda")
    with pytest.raises(ValueError, match="device must be"):
        slurm.job_script(out=tmp_path, lab_dir=Path("/l"), tasks=1, jobs=1, device="gpu")


def test_cli_checks_slurm_devices_against_the_lab(tmp_path, capsys, monkeypatch):
    """The login node needs no GPU; the lab's devices and the GPUs per grade are checked there."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(slurm.shutil, "which", lambda name: "/usr/bin/sbatch")
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "a.py").write_text("")
    base = ["batch", str(subs), "--out", str(tmp_path / "g"), "--slurm"]
    assert main(base + ["--lab", "04_pipeline_schedule", "--device", "cuda"]) == 2
    assert "grade it with --device cpu" in capsys.readouterr().err
    # One GPU per grade is allowed (its ranks share it): the array asks for jobs × 1 GPUs.
    script = slurm.job_script(out=tmp_path / "g", lab_dir=Path("labs/02_ddp"), tasks=1, jobs=2,
                              device="cuda", gpus_per_grade=1)
    assert "#SBATCH --gres=gpu:2" in script and "--device cuda --gpus-per-grade 1" in script
    assert main(base + ["--lab", "02_ddp", "--gpus-per-grade", "2"]) == 2
    assert "add --device cuda" in capsys.readouterr().err


def test_gather_merges_parts_and_zeroes_a_lost_task(tmp_path):
    out = tmp_path / "graded"
    done = out / "slurm" / "results" / "0"
    (done / "alice").mkdir(parents=True)
    (done / "alice" / "results.json").write_text(json.dumps({"score": 13.0, "tests": []}))
    with open(done / "summary.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["submission", "score", "max_score", "failures"])
        w.writeheader()
        w.writerow({"submission": "alice", "score": 13.0, "max_score": 13, "failures": ""})
    (out / "slurm" / "results" / "1").mkdir(parents=True)  # task 1 died: nothing written
    rows = slurm.gather(out, [[Path("alice")], [Path("bob.py")]], max_score=13)
    assert [(r["submission"], float(r["score"]), r["failures"]) for r in rows] == [
        ("alice", 13.0, ""), ("bob", 0.0, slurm.LOST)]
    assert json.loads((out / "alice" / "results.json").read_text())["score"] == 13.0
    lost = json.loads((out / "bob" / "results.json").read_text())
    assert lost["score"] == 0.0 and "array task 1" in lost["output"]
    with open(out / "summary.csv") as f:
        assert [r["submission"] for r in csv.DictReader(f)] == ["alice", "bob"]


def test_cli_says_what_is_missing(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # main() sets it; restored after the test
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "a.py").write_text("")
    args = ["batch", str(subs), "--lab", "01_collectives", "--out", str(tmp_path / "g")]
    assert main(args + ["--sbatch=--time=1:00:00"]) == 2
    assert "--sbatch passes options to SLURM's sbatch: add --slurm" in capsys.readouterr().err
    monkeypatch.setattr(slurm.shutil, "which", lambda name: None)
    assert main(args + ["--slurm"]) == 2
    assert "--slurm needs SLURM's sbatch on PATH" in capsys.readouterr().err
