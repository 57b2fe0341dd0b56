"""Lab 02's hidden checks: 4 ranks, more bucket caps, bucket order, and the edge cases of a
parameter without gradient. Instructors only: `autograder release` leaves this folder out of
the student edition; the grader marks these checks hidden (visibility "after_published")."""

from __future__ import annotations

import importlib
import sys

from autograder.lab import CaseResult, Check, Verdict

visible = sys.modules.get("_autograder_lab_02_ddp_checks") or importlib.import_module("checks")
cases, TOY, MLP = visible.cases, visible.TOY, visible.MLP


def judge_order_and_overlap(r: CaseResult) -> Verdict:
    """Traffic only (not the values): buckets in order, overlapping with backward."""
    order = visible.judge_order(r)
    return visible.judge_overlap(r) if order.passed else order


CHECKS = [
    Check("assign_buckets: one element, a cap met exactly, a cap missed by one byte", 6,
          "buckets", ({"world_size": 1, "sizes": [[1], [300, 1, 1, 300], [10] * 7],
                       "caps": [4, 1200, 1201, 28]},), visible.judge_buckets),
    Check("DDP at 4 ranks: frozen head bias, frozen first layer, tied weight, unused branch", 16,
          "train", cases({"world_size": 4, **TOY, "frozen": ["head.bias"]},
                         {"world_size": 4, **MLP, "frozen": ["layers.0.weight"]}, seed=100),
          visible.judge_train),
    Check("DDP at 4 ranks: one all-reduce per bucket, in reverse parameter order, overlapping "
          "with backward; a 1-byte cap", 20, "train",
          cases({"world_size": 4, **TOY, "side": False}, {"world_size": 4, **MLP, "cap": 1},
                seed=110, steps=2), judge_order_and_overlap),
    Check("no_sync() at 4 ranks with a branch used in step 0 only", 8, "train",
          cases({"world_size": 4, **TOY, "accumulate": 2}, seed=130, steps=2),
          visible.judge_no_sync),
    Check("DDP: a parameter without gradient, with one bucket and with one bucket per parameter",
          10, "train", cases({"world_size": 2, **TOY, "cap": 10**9},
                             {"world_size": 2, **TOY, "cap": 1}, seed=140),
          visible.judge_values_then_order,
          about="Values, then every bucket sent once per step, in order, with the trainable "
                "bytes."),
]
