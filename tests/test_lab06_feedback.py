"""Lab 06's feedback names the usual mistakes of mixed precision (issue 16): each fault file in
tests/faults/06_mixed_precision/ is the reference with one mistake appended (the later
definition wins); graded on the one visible check that must catch it (one case, real ranks), it
scores zero there with a message that names the mistake. The reference's full marks, the
release and the stubs are tested with every lab in test_autograder.py."""

from __future__ import annotations

import pytest
from faultkit import ROOT, assert_failed, grade_fault_on_check

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
}


@pytest.mark.multirank
@pytest.mark.parametrize("fault", sorted(CASES))
def test_the_usual_mistake_is_named(fault, tmp_path):
    prefix, says = CASES[fault]
    check = grade_fault_on_check(LAB_DIR, FAULTS, fault, prefix, tmp_path)
    assert_failed(check, "wrong_result", *says)


def test_every_fault_file_has_a_case():
    assert {p.stem for p in FAULTS.glob("*.py")} == set(CASES)
