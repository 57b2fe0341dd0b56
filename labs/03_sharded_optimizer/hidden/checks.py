"""Lab 03's hidden checks: more world sizes, tiny parameters, frozen layers, Adam, traffic and
the full state dict. Instructors only: `autograder release` leaves this folder out of the
student edition; the grader marks these checks hidden (visibility "after_published")."""

from __future__ import annotations

import importlib
import sys

from autograder.lab import Check

visible = (sys.modules.get("_autograder_lab_03_sharded_optimizer_checks")
           or importlib.import_module("checks"))
cases = visible.cases

CHECKS = [
    Check("shard_bounds and flatten_padded: n < p and larger n", 6, "bounds",
          ({"world_size": 1, "sizes": [2, 3, 5, 1000]},), visible.judge_bounds),
    Check("ShardedOptimizer (SGD): 4 ranks, a 1-element bias, a whole frozen layer", 12, "zero",
          cases([(4, (2, 3, 1), ()), (4, (6, 5, 4), ("2.weight", "2.bias"))], seed=100,
                optimizer="sgd"), visible.judge_zero),
    Check("ShardedOptimizer (Adam): equals single-process training at 3 and 4 ranks", 10, "zero",
          cases([(3, (7, 5, 3), ("0.weight",)), (4, (4, 9, 2), ())], seed=110,
                optimizer="adam"), visible.judge_zero),
    Check("ShardedOptimizer: one reduce-scatter and one all-gather per step, no all-reduce", 6,
          "zero", cases([(2, (7, 5, 3), ())], seed=120, optimizer="sgd"),
          visible.judge_zero_traffic),
    Check("FSDPLinear: 3 and 4 ranks, deeper models", 12, "fsdp",
          cases([(3, (5, 7, 6, 3), ()), (4, (2, 3, 1), ())], seed=130), visible.judge_fsdp),
    Check("FSDPLinear: traffic and release at 4 ranks", 6, "fsdp",
          cases([(4, (5, 6, 3), ())], seed=140, release=True), visible.judge_fsdp_traffic),
    Check("FSDPLinear.full_state_dict: the full parameters on every rank", 8, "fsdp_state",
          cases([(2, (5, 6, 3), ()), (3, (4, 5, 2), ())], seed=150), visible.judge_fsdp_state),
]
