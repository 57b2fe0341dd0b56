"""Lab 05's all-reduces are judged by what they carry (issue 19, pass 3): each fault file in
tests/faults/05_tensor_parallel_mlp/ is the reference with one cheat appended (the later
definition wins), graded on the first case of the visible checks it aims at (real ranks).

* dense_decoy: every rank computes the whole dense MLP from a kept copy and all-reduces zeros
  of the right size. The MLP's ranks are given only their own shard (zeros elsewhere), so the
  dense copy is wrong and the values fail; the all-reduce's contents (the courier's copy of its
  input, against the rank's partial product) fail the traffic check.
* column_zero_decoy: a column-parallel layer, which is handed the whole dense Linear, computes
  the whole input gradient itself and all-reduces zeros. Values, counts and bytes are right:
  only the contents check catches it, and the other checks pass.
* from_dense_all_reduce: the MLP's from_dense all-reduces the ranks' views of the dense weights
  (rebuilding the dense MLP on every rank) before forward's section opens; forged_sections
  closes forward's section around an extra all-reduce. Values, contents and the per-section
  counts are right: the count over the whole case (the courier's bounds, not the rank's marks)
  fails the MLP's traffic check alone.
The reference's full marks, the release and the stubs are tested with every lab in
test_autograder.py.
"""

from __future__ import annotations

import pytest
from faultkit import ROOT, assert_fault

LAB_DIR = ROOT / "labs" / "05_tensor_parallel_mlp"
FAULTS = ROOT / "tests" / "faults" / "05_tensor_parallel_mlp"
FG, COLUMN = "copy_to_tp (f)", "ColumnParallelLinear"
MLP, MLP_TRAFFIC = "ParallelMLP: output", "ParallelMLP: exactly one"

# fault -> {check prefix: None (must pass) or regexes its (failed, wrong_result) message matches}
CASES = {
    "dense_decoy": {
        FG: None, COLUMN: None,
        MLP: [r"the output on rank 0"],
        MLP_TRAFFIC: [r"mlp: rank 0's forward all-reduce does not carry this rank's partial "
                      r"product GELU\(X·A_r \+ b₁_r\)·B_r", r"element \d+ is 0,"]},
    "column_zero_decoy": {
        FG: None, MLP: None, MLP_TRAFFIC: None,
        COLUMN: [r"column: rank 0's backward all-reduce does not carry this rank's partial "
                 r"input gradient", r"each rank computes only with its own shard"]},
    "from_dense_all_reduce": {
        FG: None, COLUMN: None, MLP: None,
        MLP_TRAFFIC: [r"rank 0 made 3 all-reduce\(s\) in the case", r"expected 2; 1 of them "
                      r"outside forward and backward"]},
    "forged_sections": {
        FG: None, COLUMN: None, MLP: None,
        MLP_TRAFFIC: [r"rank 0 made 3 all-reduce\(s\) in the case", r"expected 2; 1 of them "
                      r"outside forward and backward"]},
}


@pytest.mark.multirank
@pytest.mark.parametrize("fault", sorted(CASES))
def test_all_reduce_contents_are_judged(fault, tmp_path):
    want = {check: (says is None, says or []) for check, says in CASES[fault].items()}
    assert_fault(LAB_DIR, FAULTS, fault, want, tmp_path)


def test_every_fault_file_has_a_case():
    assert {p.stem for p in FAULTS.glob("*.py")} == set(CASES)
