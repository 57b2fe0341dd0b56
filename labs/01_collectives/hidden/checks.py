"""Lab 01's hidden checks: more sizes, dtypes, roots and traffic. Instructors only:
`autograder release` leaves this folder out of the student edition; the grader marks these
checks hidden (results.json visibility "after_published")."""

from __future__ import annotations

import importlib
import sys

from autograder.lab import Check

visible = (sys.modules.get("_autograder_lab_01_collectives_checks")
           or importlib.import_module("checks"))
cases = visible.cases

CHECKS = [
    Check("ring_all_reduce: float64, float16 and bfloat16; n < p; odd and 2-D shapes", 20,
          "all_reduce",
          cases((2, 3, 4), (1, 3, 65_537), ("float32",), seed=100)
          + cases((3, 4), ((7, 9),), ("float64", "float16", "bfloat16"), seed=120),
          visible.judge_all_reduce),
    Check("ring_all_reduce: traffic with sizes p does not divide", 10, "all_reduce",
          cases((3, 4), (1001, 4099), seed=140), visible.judge_ring_traffic),
    Check("tree_broadcast: the last rank as root; 1 and 10,000 elements; bfloat16", 10,
          "broadcast", cases((2, 3, 4), (1, 10_000), seed=150, src=-1)
          + cases((4,), (33,), ("bfloat16",), seed=160, src=2),
          visible.judge_broadcast),
    Check("ring_reduce_scatter and ring_all_gather: p − 1 messages, (p−1)/p·X bytes", 10,
          "reduce_scatter", cases((2, 3, 4), (4096, 999), seed=170), visible.judge_rs_traffic),
    Check("ring_all_gather: traffic, uneven chunks and float64", 10, "all_gather",
          cases((3, 4), (999, 4096), ("float32", "float64"), seed=180), visible.judge_ag_traffic),
]
