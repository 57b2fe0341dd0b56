"""Lab 03's checks rest on the case and the courier's record, not on the rank's rows or on what
it keeps at agreed names or in agreed forms (red-team passes 3-6): each file in
tests/faults/03_sharded_optimizer/ is the reference with one change appended (the later
definition wins), graded on the first case of the visible checks it names (real ranks). A cheat
loses the checks it targets and keeps the others; the fair variants (the list form of
all_gather, the list form of reduce_scatter averaging first, parameters flattened in another
order, a float64 master shard, x kept on the unit, one broadcast of the flat initial
parameters) pass. The reference's full marks are tested with every lab in
test_autograder.py."""

from __future__ import annotations

import pytest
from faultkit import ROOT, assert_fault, run_grade, source, submission

from autograder.lab import load_lab

LAB_DIR = ROOT / "labs" / "03_sharded_optimizer"
FAULTS = ROOT / "tests" / "faults" / "03_sharded_optimizer"
BOUNDS, ZERO = "shard_bounds and flatten_padded", "ShardedOptimizer (SGD + momentum)"
STATE, FSDP = "ShardedOptimizer (Adam)", "FSDPLinear: shards in place"
RELEASE = "FSDPLinear: 2 all-gathers"

# fault -> {check: (passes, regexes its message must match when it fails)}
CASES = {
    "bounds_rows": {BOUNDS: (False, [r"result does not have the form the lab's harness returns "
                                     r"\(nothing of it was judged\): 0 items, expected 16"])},
    "replicated_state": {ZERO: (False, [r"the parameters are right, but the run was not "
                                         r"sharded: rank 0's reduce-scatters took \[108, 108, "
                                         r"108\] elements in", r"p·S = 54"]),
                         STATE: (False, [r"reduce-scatters took \[116, 116, 116\] elements in",
                                         r"p·S = 58"])},
    "fsdp_keep_full": {FSDP: (True, []),
                       RELEASE: (False, [r"rank 0 still held \d[\d,]* bytes of gathered parameters "
                                         r"after forward"])},
    "fair_all_gather_list": {FSDP: (True, []), RELEASE: (True, [])},
    "allgather_grads": {ZERO: (False, [r"not sharded: rank 0's all-gather in step 1 did not "
                                       r"take in its shard of the updated parameters"]),
                        STATE: (False, [r"rank 0's all-gather in step 1 did not take in its "
                                        r"shard of the updated parameters"])},
    "zero_hooks_broadcast": {ZERO: (False, [r"not sharded: rank 0's broadcast 1"]),
                             STATE: (False, [r"rank 0's broadcast 1: it sent something "
                                             r"other than the initial parameters"])},
    "fsdp_list_parts": {FSDP: (True, []),
                        RELEASE: (False, [r"rank 0 still held \d[\d,]* bytes of gathered "
                                          r"parameters after forward"])},
    "fsdp_zeroed_buffer": {FSDP: (True, []),
                           RELEASE: (False, [r"rank 0 still held \d[\d,]* bytes of gathered "
                                             r"parameters after forward"])},
    "fair_zero_reversed": {ZERO: (True, []), STATE: (True, [])},
    "zero_signed_zeros": {ZERO: (False, [r"not sharded: rank 0's broadcast \d+: "]),
                          STATE: (False, [r"rank 0's broadcast \d+: "])},
    # Issue 30: no sharding at all (all-reduces only): 74/100 on values alone before.
    "allreduce_no_sharding": {ZERO: (False, [r"not sharded: rank 0 called all_reduce 3 times"]),
                              STATE: (False, [r"rank 0 called all_reduce 3 times"]),
                              FSDP: (False, [r"not sharded: rank 0 called all_reduce: FSDP "
                                             r"reduce-scatters"]),
                              RELEASE: (False, [r"rank 0 called all_reduce"])},
    "fsdp_parts_own_slot": {FSDP: (True, []),
                            RELEASE: (False, [r"rank 0 still held \d[\d,]* bytes of gathered "
                                              r"parameters after forward"])},
    "fair_fsdp_input_on_unit": {FSDP: (True, []), RELEASE: (True, [])},
    "fair_zero_reversed_flat_bcast": {ZERO: (True, []), STATE: (True, [])},
    "fair_zero_master64": {ZERO: (True, []), STATE: (True, [])},
    "zero_bf16_reduce_scatter": {ZERO: (False, [r"a collective carried bfloat16",
                                                r"keep the gradients and the shards in "
                                                r"float32"])},
    # Issue 30's last judge-depth gap: zeros reduce-scattered, the gradient shard moved
    # elsewhere (emulated); judged on sizes only, it kept the FSDP values checks.
    "fsdp_zeros_reduce_scatter": {FSDP: (False, [r"not sharded: rank 0's reduce-scatter 1 did "
                                                 r"not take in its flat padded gradient of a "
                                                 r"unit", r"only zeros"]),
                                  RELEASE: (False, [r"rank 0's reduce-scatter 1 did not take "
                                                    r"in", r"only zeros"])},
    "fair_fsdp_reduce_scatter_list": {FSDP: (True, []), RELEASE: (True, [])},
    "fsdp_storage": {FSDP: (True, []),
                     RELEASE: (False, [r"rank 0 still held \d[\d,]* bytes of gathered "
                                       r"parameters after forward"])},
}


@pytest.mark.multirank
@pytest.mark.parametrize("fault", sorted(CASES))
def test_checks_rest_on_the_case_and_the_courier(fault, tmp_path):
    assert_fault(LAB_DIR, FAULTS, fault, CASES[fault], tmp_path)


@pytest.mark.multirank
@pytest.mark.parametrize("fault, score", [("allreduce_no_sharding", 12),
                                          ("fsdp_zeros_reduce_scatter", 56)])
def test_a_run_that_does_not_shard_loses_those_checks(fault, score, tmp_path):
    """Issue 30, graded on the whole lab (visible and hidden): all-reduces instead of sharding
    kept 74 points on values, now only the pure functions' 12 (shard_bounds and
    flatten_padded); reduce-scatters of zeros with the shard moved elsewhere lose every FSDP
    check (44 points) and keep the rest."""
    lab = load_lab(LAB_DIR)
    text = source(fault, LAB_DIR / "sharding.py", FAULTS)
    result, _ = run_grade(lab, submission(fault, tmp_path / "subs", text=text,
                                          name="sharding.py"), tmp_path)
    assert result.score == score, [(c.check.name, c.score, c.message) for c in result.checks]


def test_every_fault_file_has_a_case():
    assert {p.stem for p in FAULTS.glob("*.py")} == set(CASES)
