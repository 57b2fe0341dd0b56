"""Fair to every correct solution (issue 19, section 5): independent correct solutions of labs
02-05 and 07, written from the student editions and kept in tests/fairness/, and labs 01, 02
and 06's references with correct variants (other cuts, other ring directions, other forms of
lab 06's inf/NaN flag: issue 30), score 100 with the hidden checks; the feedback on the usual
mistakes names them; a lab slug never resolves to a student copy."""

from __future__ import annotations

from pathlib import Path

import pytest
from faultkit import ROOT, run_grade, small_lab

from autograder.cli import _resolve
from autograder.grade import grade
from autograder.lab import CaseResult, find_lab, load_lab

FAIRNESS = ROOT / "tests" / "fairness"


def _solution(lab: str, base: str, variant: str | None, folder: Path) -> Path:
    own = FAIRNESS / lab / base  # an independent solution, or the lab's reference with a variant
    text = (own if own.exists() else ROOT / "labs" / lab / base).read_text()
    if variant:
        text += f"\n\n# ---- variant: {variant} ----\n\n"
        text += (FAIRNESS / lab / f"{variant}.py").read_text()
    path = folder / (variant or "plain") / base
    path.parent.mkdir(parents=True)
    path.write_text(text)
    return path


@pytest.mark.multirank
@pytest.mark.slow
@pytest.mark.parametrize("lab, base, variant", [
    ("01_collectives", "collectives.py", "torch_chunk_all_reduce"),
    ("01_collectives", "collectives.py", "all_gather_other_way"),
    ("01_collectives", "collectives.py", "recv_any_source"),
    ("02_ddp", "ddp.py", "barrier_in_finish"),
    ("02_ddp", "ddp.py", "wait_all_futures"),
    ("03_sharded_optimizer", "sharding.py", None),
    ("04_pipeline_schedule", "schedules.py", None),
    ("05_tensor_parallel_mlp", "tp_mlp.py", None),
    ("06_mixed_precision", "mixed_precision.py", "two_float64_flags"),
    ("06_mixed_precision", "mixed_precision.py", "flag_in_gradients"),
    ("07_expert_parallel", "moe_exchange.py", None),
])
def test_independent_solutions_score_full_marks(lab, base, variant, tmp_path):
    path = _solution(lab, base, variant, tmp_path / "subs")
    result, _ = run_grade(load_lab(ROOT / "labs" / lab), path, tmp_path)
    assert [(c.check.name, c.kind, c.message) for c in result.checks if not c.ok] == []
    assert result.score == result.max_score == 100


@pytest.mark.multirank
def test_a_receive_from_any_rank_is_fair(tmp_path):
    """`dist.recv(buf)` without `src` returns the sender (the courier's answer), at 2 and 4
    ranks, and the ring's traffic is judged by who really sent (red team 3, probe07)."""
    path = _solution("01_collectives", "collectives.py", "recv_any_source", tmp_path / "subs")
    lab = small_lab(load_lab(ROOT / "labs" / "01_collectives", hidden=False), ["ar", "ring4"])
    result, _ = run_grade(lab, path, tmp_path)
    assert [(c.check.name, c.kind, c.message) for c in result.checks if not c.ok] == []
    assert result.score == result.max_score


def _judge(lab: str, index_of_call: str):
    checks = load_lab(ROOT / "labs" / lab).checks
    return next(c for c in checks if c.call == index_of_call).judge.__globals__


def test_bubble_ratio_mixup_is_named():
    """(p−1)/m is the bubble's ratio to the ideal compute time, not the idle fraction."""
    judge = _judge("04_pipeline_schedule", "bubble")["judge_bubble_formula"]
    case = {"world_size": 1, "fn": "bubble", "p": 4, "m": 8}
    verdict = judge(CaseResult(case, 1, [(4, 8)], [3 / 8], []))
    assert not verdict.passed
    assert "(p−1)/m" in verdict.message and "ideal compute time" in verdict.message
    assert "(p−1)/(m+p−1)" in verdict.message
    right = judge(CaseResult(case, 1, [(4, 8)], [3 / 11], []))
    assert right.passed


def test_a_refused_collective_says_what_the_lab_allows():
    lab01 = load_lab(ROOT / "labs" / "01_collectives").info
    lab03 = load_lab(ROOT / "labs" / "03_sharded_optimizer").info
    assert "build it from send/recv" in lab01.refusal().format(op="all_reduce")
    said = lab03.refusal().format(op="all_to_all")
    assert "allows" in said and "reduce_scatter_tensor" in said and "send/recv" not in said
    assert {"reduce_scatter_single", "all_gather_single"} <= lab03.allowed_ops


def test_a_slug_resolves_in_the_labs_root_only(tmp_path, monkeypatch):
    """A student copy named like the lab in the current folder is never taken for the lab."""
    copy = tmp_path / "01_collectives"
    copy.mkdir()
    (copy / "checks.py").write_text("raise SystemExit('the student copy was loaded')\n")
    (copy / "collectives.py").write_text("")
    monkeypatch.chdir(tmp_path)
    lab_dir, _ = _resolve(Path("collectives.py"), "01_collectives")
    assert lab_dir == (ROOT / "labs" / "01_collectives").resolve()
    assert find_lab("./01_collectives") == copy.resolve()  # a path, taken as given
    with pytest.raises(ValueError, match="not a lab folder"):
        find_lab("./nowhere")


def test_the_report_says_when_hidden_checks_did_not_run(tmp_path):
    bad = tmp_path / "collectives.py"
    bad.write_text("def ring_all_reduce(t:\n")
    visible_only = grade(load_lab(ROOT / "labs" / "01_collectives", hidden=False), bad)
    assert any("Hidden checks were not run" in n for n in visible_only.notes)
    everything = grade(load_lab(ROOT / "labs" / "01_collectives"), bad)
    assert not any("Hidden checks" in n for n in everything.notes)
