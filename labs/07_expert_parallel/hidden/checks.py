"""Lab 07's hidden checks: capacities whose quotient is near an integer, other orders and
capacities for the kept choices (one laid out with top-3, so that every wrong order fails), 3
ranks with two experts each, top-2 with cf 1.25 (once laid out: every pair of ranks exchanges
pieces of different sizes), no capacity limit (cf None), a rank with one token. Instructors
only (`autograder release` leaves this folder out)."""

from __future__ import annotations

import sys

from autograder.lab import Check

visible = sys.modules["_autograder_lab_07_expert_parallel_checks"]
case, MOE = visible.case, visible.MOE

CHECKS = [
    Check("expert_capacity: quotients near an integer, k = E, one token", 8, "capacity",
          (case("capacity", 1, 100, table=[[10, 11, 1, 1.1], [30, 10, 1, 1.1], [1, 8, 2, 1.0],
                                           [64, 8, 8, 1.0], [3, 6, 1, 0.5], [0, 4, 1, 1.0],
                                           [13, 2, 1, None], [100, 16, 2, 1.25]]),),
          visible.judge_capacity),
    Check("keep: top-1 and top-3, a hot expert, capacity 1", 10, "keep",
          (case("keep", 1, 110, tokens=20, experts=5, top_k=1, capacity=3, hot=6.0),
           case("keep", 1, 111, tokens=9, experts=6, top_k=3, capacity=1, hot=2.0),
           case("keep", 1, 112, tokens=16, experts=4, top_k=2, capacity=8, hot=1.0),
           case("keep", 1, 113, tokens=10, experts=5, top_k=3, capacity=3, layout="order")),
          visible.judge_keep),
    Check("dispatch/combine: 3 ranks, two experts each, top-2 with cf 1.25", 14, "moe",
          (case("moe", 3, 120, experts=6, tokens=[10, 4, 7],
                **{**MOE, "top_k": 2, "capacity_factor": 1.25}),
           case("moe", 3, 121, experts=6, tokens=[10, 4, 7], layout="uneven",
                **{**MOE, "top_k": 2, "capacity_factor": 1.25})),
          visible.judge_moe, timeout=60),
    Check("dispatch/combine: 2 ranks, no capacity limit, a rank with one token", 10, "moe",
          (case("moe", 2, 130, experts=6, tokens=[11, 1],
                **{**MOE, "top_k": 2, "capacity_factor": None}),),
          visible.judge_moe, timeout=60),
    Check("dispatch/combine: 4 ranks, two experts each, heavy drops (cf 0.5)", 18, "moe",
          (case("moe", 4, 140, experts=8, tokens=[9, 12, 5, 8],
                **{**MOE, "d": 5, "top_k": 1, "capacity_factor": 0.5}),),
          visible.judge_moe, timeout=60),
]
