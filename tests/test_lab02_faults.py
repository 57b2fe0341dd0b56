"""Lab 02's overlap check rests on the courier's gate, not on the rank's word (issue 19 §2), its
traffic on each all-reduce's bytes, and assign_buckets on the case's sizes (red-team pass 3):
each fault file in tests/faults/02_ddp/ is the reference with one cheat appended (the later
definition wins), graded on the first case of the visible checks it names (real ranks). A
cheat that keeps the values right must lose the checks it targets only; one that skips the gate
must lose the values. The reference's full marks, the release and the stubs are tested with
every lab in test_autograder.py."""

from __future__ import annotations

import pytest
from faultkit import (ROOT, assert_failed, assert_fault, assert_passed, grade_fault_on_checks,
                      run_grade, source, submission)

from autograder.lab import load_lab

LAB_DIR = ROOT / "labs" / "02_ddp"
FAULTS = ROOT / "tests" / "faults" / "02_ddp"
VALUES, OVERLAP = "DDP: after 3 steps", "DDP: an all-reduce starts during backward"
TRAFFIC, BUCKETS = "DDP: one all-reduce per bucket", "assign_buckets: reverse parameter order"
NO_SYNC = "no_sync(): sends nothing"
ROWS = [r"rank 0's result does not have the form the lab's harness returns \(nothing of it "
        r"was judged\): (0|1) items, expected 8"]

# fault -> (passes values, passes overlap, regexes the first failed check's message must match)
CASES = {
    "forged_graph_done": (True, False, [r"all 3 all-reduces started after backward had "
                                        r"reached the first layer: no overlap",
                                        r"from the gradient hook \(grad_ready\)"]),
    "gate_asked_early": (True, False, [r"all 3 all-reduces started after backward had reached "
                                       r"the first layer"]),
    "gate_skipped": (False, False, [r"rank 0's a\.weight differs from single-process training",
                                    r"check which slice of which bucket"]),
}


# fault -> {check: (passes, regexes its message must match when it fails)}
MORE = {
    "zero_decoys": {VALUES: (True, []),
                    TRAFFIC: (False, [r"2 all-reduces in 2 steps; the 7 trainable parameters "
                                      r"make 3 bucket\(s\), one all-reduce each per step "
                                      r"\(6 in all\)"]),
                    OVERLAP: (False, [r"2 all-reduces in 2 steps; the 8 trainable parameters "
                                      r"make 3 bucket\(s\)"])},
    "bucket_rows": {BUCKETS: (False, ROWS)},
    "bucket_rows_memory": {BUCKETS: (False, ROWS)},  # judged without allocating 3 × 10**12
    # Issue 30: decoys in forward, a forged sync{k}:end, the real all-reduces per parameter.
    "decoy_sections": {VALUES: (True, []),
                       TRAFFIC: (False, [r"rank 0 .*: 20 all-reduces in 2 steps; the 7 "
                                         r"trainable parameters make 3 bucket\(s\)"]),
                       OVERLAP: (False, [r"22 all-reduces in 2 steps"]),
                       NO_SYNC: (False, [r"all-reduces in 2 steps"])},
    # Issue 31 §3: the traffic checks judge traffic whatever the values.
    "missing_division": {VALUES: (False, [r"summed\* over the 2 ranks"]),
                         TRAFFIC: (True, []), OVERLAP: (True, []),
                         NO_SYNC: (False, [r"summed\* over the 2 ranks"])},
    # Issue 30: 20,000 all-reduces in one backward, judged in linear time (was quadratic).
    "traffic_flood": {TRAFFIC: (False, [r"20006 all-reduces in 2 steps"])},
}


@pytest.mark.multirank
@pytest.mark.parametrize("fault", sorted(MORE))
def test_rows_and_bytes_come_from_the_case_and_the_courier(fault, tmp_path):
    assert_fault(LAB_DIR, FAULTS, fault, MORE[fault], tmp_path)


@pytest.mark.multirank
@pytest.mark.parametrize("fault", sorted(CASES))
def test_overlap_is_judged_by_the_gate(fault, tmp_path):
    values_pass, overlap_pass, says = CASES[fault]
    values, overlap = grade_fault_on_checks(LAB_DIR, FAULTS, fault, [VALUES, OVERLAP], tmp_path)
    assert (values.ok, overlap.ok) == (values_pass, overlap_pass), (values.message,
                                                                   overlap.message)
    first = values if not values_pass else overlap
    assert_failed(first, "wrong_result", *says)
    if values_pass:
        assert_passed(values)


# A full grade (visible and hidden checks) of a fault: the score it now gets (issue 30: the
# naive DDP scored 100; issue 31: the missing division scored 12).
SCORES = {"decoy_sections": 40, "missing_division": 48}


@pytest.mark.multirank
@pytest.mark.parametrize("fault", sorted(SCORES))
def test_the_score_a_fault_gets_on_the_whole_lab(fault, tmp_path):
    lab = load_lab(LAB_DIR)
    text = source(fault, LAB_DIR / "ddp.py", FAULTS)
    result, _ = run_grade(lab, submission(fault, tmp_path / "subs", text=text, name="ddp.py"),
                          tmp_path)
    assert result.score == SCORES[fault], [(c.check.name, c.score, c.message)
                                           for c in result.checks]


def test_every_fault_file_has_a_case():
    assert {p.stem for p in FAULTS.glob("*.py")} == set(CASES) | set(MORE)
    assert set(SCORES) <= set(MORE)
