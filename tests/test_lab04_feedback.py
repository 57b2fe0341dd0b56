"""Lab 04's zero-bubble feedback names the usual mistakes of ZB-H1 (issue 17): each fault file in
tests/faults/04_pipeline_schedule/ is the reference with its `zb_h1` redefined (the later
definition wins); graded on the one visible check that must catch it (one case), it scores zero
there with a message that names the mistake, and the other ZB-H1 checks it is run with still
pass. The reference's full marks, the release and the stubs are tested with every lab in
test_autograder.py; the independent solution in test_autograder_fairness.py."""

from __future__ import annotations

import dataclasses

import pytest
from faultkit import ROOT, assert_failed, assert_passed, run_grade, source, submission

from autograder.lab import CaseResult, load_lab
from autograder.sandbox.rank import load_module
from toolkit import pipeline

LAB_DIR = ROOT / "labs" / "04_pipeline_schedule"
FAULTS = ROOT / "tests" / "faults" / "04_pipeline_schedule"
CHECKS = ("zb_h1: a valid split", "zb_h1: no more activations", "zb_h1: idle")

# fault -> {a check that must fail (wrong_result): regexes its message must match}; the other
# checks of CHECKS must pass (an invalid schedule fails them all, w_before_b: every check).
CASES = {
    "w_before_b": {prefix: [r"\[order\] stage 0: W0 \(step \d+\) comes before B0",
                            r"output gradient its B received"] for prefix in CHECKS},
    # Split but filling no gap: (p−1)(t_F + t_B) idle per stage, 6 of 30 time units at t = 1.
    "w_at_the_end": {"zb_h1: no more activations": [
                         r"stage 0 holds 8 micro-batches between their F and their W",
                         r"min\(p, m\) = 4", r"put off until after the stage's last B",
                         r"more than 1F1B ever holds"],
                     "zb_h1: idle": [r"idle 20\.0% of the step",
                                     r"ZB-H1's bubble .* 11\.1% of the step",
                                     r"That is \(p−1\)\(t_F \+ t_B\) per stage"]},
    "w_right_after_b": {"zb_h1: idle": [r"idle 20\.0% of the step",
                                        r"ZB-H1's bubble .* 11\.1% of the step",
                                        r"W ops fill none of the drain"]},
}


@pytest.mark.parametrize("fault", sorted(CASES))
def test_the_usual_zero_bubble_mistake_is_named(fault, tmp_path):
    failing = CASES[fault]
    lab = load_lab(LAB_DIR, hidden=False)
    # One case each, p = 4 and m = 8 where a check has it (the first case otherwise).
    checks = []
    for prefix in CHECKS:
        check = next(c for c in lab.checks if c.name.startswith(prefix))
        case = next((c for c in check.cases if (c["p"], c["m"]) == (4, 8)), check.cases[0])
        checks.append(dataclasses.replace(check, cases=(case,), timeout=60.0))
    small = dataclasses.replace(lab, checks=checks)
    text = source(fault, LAB_DIR / "schedules.py", FAULTS)
    path = submission(fault, tmp_path / "subs", text=text, name="schedules.py")
    result, _ = run_grade(small, path, tmp_path)
    for prefix, check in zip(CHECKS, result.checks):
        if prefix in failing:
            assert_failed(check, "wrong_result", *failing[prefix])
        else:
            assert_passed(check)


def test_every_fault_file_has_a_case():
    assert {p.stem for p in FAULTS.glob("*.py")} == set(CASES) | {"nan_bubble"}


def test_a_nan_bubble_fraction_fails_at_the_form_and_at_the_judge(tmp_path):
    """Red team 8: `bubble_fraction` returning NaN passed the formula check (a judge testing
    `abs(got - want) > 1e-9`, False for NaN). Graded, the float form refuses it before the
    judge; the judge, handed a NaN directly, fails it as well."""
    lab = load_lab(LAB_DIR, hidden=False)
    check = next(c for c in lab.checks if c.call == "bubble")
    small = dataclasses.replace(lab, checks=[dataclasses.replace(check, timeout=60.0)])
    text = source("nan_bubble", LAB_DIR / "schedules.py", FAULTS)
    result, _ = run_grade(small, submission("nan_bubble", tmp_path / "subs", text=text,
                                            name="schedules.py"), tmp_path)
    assert_failed(result.checks[0], "wrong_result", r"does not have the form",
                  r"nan: a finite number expected")
    assert result.score == 0
    case = check.cases[0]
    judged = check.judge(CaseResult(case, 1, [(case["p"], case["m"])], [float("nan")], []))
    assert not judged.passed and "returned nan" in judged.message


def test_the_zero_bubble_checks_ask_what_the_paper_promises():
    """Every case of the ZB-H1 bubble checks (visible and hidden) is one where the toolkit's
    ZB-H1 simulates to exactly the paper's (p−1)(t_F + t_B − t_W) (m >= p, t_W <= t_F, t_B),
    and the reference in the lab's student file is the toolkit's schedule, op for op."""
    lab = load_lab(LAB_DIR)
    bubble = [c for c in lab.checks if c.judge.__name__ == "judge_zb_bubble"]
    assert [c.visible for c in bubble] == [True, False]
    reference = load_module(LAB_DIR / "schedules.py", "_test_lab04_reference")
    for case in (case for check in bubble for case in check.cases):
        p, m = case["p"], case["m"]
        times = {k: case[k] for k in ("forward", "backward", "weight")}
        assert m >= p and times["weight"] <= min(times["forward"], times["backward"])
        got = pipeline.simulate(pipeline.zb_h1(p, m), **times).bubble
        assert got == pytest.approx(pipeline.bubble_fraction("zb-h1", p=p, m=m, **times),
                                    abs=1e-12)
        assert reference.zb_h1(p, m) == [[str(op) for op in ops]
                                         for ops in pipeline.zb_h1(p, m).stages]
