"""Lab 06's feedback names the usual mistakes of mixed precision (issue 16): each fault file in
tests/faults/06_mixed_precision/ is the reference with one mistake appended (the later
definition wins); graded on the one visible check that must catch it (one case, real ranks), it
scores zero there with a message that names the mistake. The reference's full marks, the
release and the stubs are tested with every lab in test_autograder.py."""

from __future__ import annotations

import dataclasses

import pytest
from faultkit import ROOT, assert_failed, grade_fault_on_check, run_grade, source, submission

from autograder.lab import load_lab

LAB_DIR = ROOT / "labs" / "06_mixed_precision"
FAULTS = ROOT / "tests" / "faults" / "06_mixed_precision"

# fault -> (the check's name prefix, regexes its message must match)
CASES = {
    "unscale_twice": ("train_step: masters follow", [r"unscaled twice", r"1/1024 as far"]),
    "inf_one_rank": ("LossScaler.unscale_", [r"checking inf on one rank only",
                                             r"rank 0 did not find one, rank 1 found one",
                                             r"all-reduce the flag \(MAX\)"]),
    "scaled_gradients": ("LossScaler.unscale_", [r"master\.grad is the scaled gradient",
                                                 r"steps with scaled gradients"]),
    "masters_not_kept": ("master_copy", [r"master weights not kept",
                                         r"shares memory with its working parameter"]),
    "forged_sections": ("all_reduce_gradients: the mean", [r"rank 0 made 2 all-reduces",
                                                           r"all-reduce it once"]),
}


# Not mistakes of mixed precision but calls torch refuses or the grader's channel does not
# carry: ordinary exceptions of the rank, never "tampering" or "still the stub" (red team 3).
ERRORS = {
    "float8_all_reduce": [r"TypeError: all_reduce on a float8_e4m3fn tensor",
                          r"carries only float64, float32, float16, bfloat16",
                          r"mixed_precision\.py line \d+ \(in all_reduce_gradients"],
    "meta_all_reduce": [r"raised NotImplementedError", r"meta"],
}


@pytest.mark.multirank
@pytest.mark.parametrize("fault", sorted(CASES))
def test_the_usual_mistake_is_named(fault, tmp_path):
    prefix, says = CASES[fault]
    check = grade_fault_on_check(LAB_DIR, FAULTS, fault, prefix, tmp_path)
    assert_failed(check, "wrong_result", *says)


@pytest.mark.multirank
@pytest.mark.parametrize("fault", sorted(ERRORS))
def test_an_unsupported_call_is_the_ranks_exception(fault, tmp_path):
    check = grade_fault_on_check(LAB_DIR, FAULTS, fault, "all_reduce_gradients: the mean",
                                 tmp_path)
    assert_failed(check, "exception", *ERRORS[fault])


# broadcast_shapes: the grader's memory under it (tests/test_autograder_memory.py); futex_channel:
# red team 8's covert channel (tests/test_lab06_contents.py)
ELSEWHERE = {"broadcast_shapes", "futex_channel"}


def test_every_fault_file_has_a_case():
    assert {p.stem for p in FAULTS.glob("*.py")} == set(CASES) | set(ERRORS) | ELSEWHERE


@pytest.mark.multirank
def test_forged_sections_do_not_hide_a_float32_all_reduce(tmp_path):
    """Red team 3: a float32 gradient all-reduce moved out of the counted section by forged
    marks, a bf16 decoy of zeros inside. Judged over the whole case (its bounds are the
    courier's), the visible and hidden byte checks fail; since red team 8 every all-reduce is
    judged by its contents too, so the values check fails on the decoy of zeros, which carries
    no gradient, while the float32 one, outside every section, is found by its contents."""
    lab = load_lab(LAB_DIR, hidden=True)
    names = ["all_reduce_gradients: the mean", "train_step: masters follow",
             "train_step: 4 ranks, overflows on two ranks"]
    checks = [next(c for c in lab.checks if c.name.startswith(n)) for n in names]
    small = dataclasses.replace(lab, checks=[
        dataclasses.replace(c, cases=c.cases[:1], timeout=60.0) for c in checks])
    text = source("forged_sections", LAB_DIR / "mixed_precision.py", FAULTS)
    result, _ = run_grade(small, submission("forged_sections", tmp_path / "subs", text=text,
                                            name="mixed_precision.py"), tmp_path)
    reduce, train, train_bytes = result.checks
    assert_failed(reduce, "wrong_result", r"rank 0 made 2 all-reduces")
    psi = 3 * (6 + 1)  # TRAIN: d_out × (d_in + 1)
    assert_failed(train, "wrong_result", rf"rank 0's all-reduce 2 in step 0 \({2 * psi} bytes "
                                         r"of bfloat16\) carried neither its gradients")
    assert_failed(train_bytes, "wrong_result", r"carried neither its gradients")
