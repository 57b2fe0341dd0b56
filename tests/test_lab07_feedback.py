"""Lab 07's feedback names the usual mistakes of expert parallelism (issue 17): each fault file
in tests/faults/07_expert_parallel/ is the reference with one mistake appended (the later
definition wins); graded on the one visible check that must catch it (one case, real ranks for
the layer), it scores zero there with a message that names the mistake, whatever the grade's
secret: the wrong drop order and the unswapped backward are caught on laid-out cases
(labs/07_expert_parallel/layouts.py; tests/test_lab07_cases.py checks the layouts over 200
seeds). One file is a cheat, not a mistake: local_experts (red-team pass 3) runs every expert
on every rank, which a rank holding only its own experts' weights cannot do; keep_sends makes
sends in keep(), before the forward section opens, counted over the whole case. The reference's
full marks, the release and the stubs are tested with every lab in
test_autograder.py."""

from __future__ import annotations

import pytest
from faultkit import ROOT, assert_failed, grade_fault_on_check

LAB_DIR = ROOT / "labs" / "07_expert_parallel"
FAULTS = ROOT / "tests" / "faults" / "07_expert_parallel"

# fault -> (the check's name prefix, the failure kind, regexes its message must match)
CASES = {
    "capacity_floor": ("expert_capacity", "wrong_result",
                       [r"floor instead of ceil", r"expert_capacity\(10, 4, top_k=1"]),
    "capacity_off_by_one": ("keep", "wrong_result",
                            [r"capacity off by one", r"keep slot < C", r"dropped \d+ choices"]),
    "wrong_drop_order": ("keep", "wrong_result",
                         [r"tokens dropped in the wrong order", r"first choice before any "
                                                                r"second choice"]),
    "combine_without_gates": ("dispatch/combine: outputs", "wrong_result",
                              [r"combine without gate weights"]),
    "backward_splits_not_swapped": ("dispatch/combine: outputs", "exception",
                                    [r"send it back with the splits swapped"]),
    # Red-team pass 3 (issue 19): every rank runs every expert itself. A rank now holds its
    # own experts' weights only, so another rank's expert is out of its reach.
    "local_experts": ("dispatch/combine: outputs", "exception",
                      [r"Rank \d raised IndexError: index \d+ is out of bounds",
                       r"in combine"]),
    # Sends outside forward and backward (in keep): the bytes are judged over the whole case.
    "keep_sends": ("dispatch/combine: outputs", "wrong_result",
                   [r"rank 0 sent \d+ message\(s\) of \d+ bytes in the case, expected",
                    r"8 bytes outside dispatch and combine"]),
}


@pytest.mark.multirank
@pytest.mark.parametrize("fault", sorted(CASES))
def test_the_usual_mistake_is_named(fault, tmp_path):
    prefix, kind, says = CASES[fault]
    check = grade_fault_on_check(LAB_DIR, FAULTS, fault, prefix, tmp_path)
    assert_failed(check, kind, *says)


def test_every_fault_file_has_a_case():
    assert {p.stem for p in FAULTS.glob("*.py")} == set(CASES)
