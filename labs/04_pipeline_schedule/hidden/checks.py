"""Lab 04's hidden checks: more shapes (m < p, p = 1, odd p), per-stage memory, the simulated
bubble, and more real runs. Instructors only (`autograder release` leaves this folder out)."""

from __future__ import annotations

import sys

from autograder.lab import Check

visible = sys.modules["_autograder_lab_04_pipeline_schedule_checks"]
cases, grid = visible.cases, visible.grid

CHECKS = [
    Check("one_f_one_b: valid and within min(p − r, m) in flight for p 1-6, m 1-16", 20,
          "schedule", cases("one_f_one_b", grid((1, 2, 3, 4, 6), (1, 2, 3, 5, 8, 16)), seed=100),
          visible.judge_in_flight),
    Check("one_f_one_b: simulated bubble no larger than (p−1)/(m+p−1)", 15, "schedule",
          cases("one_f_one_b", grid((2, 3, 4, 8), (1, 4, 7, 16)), seed=200),
          visible.judge_bubble_simulated),
    Check("one_f_one_b on real ranks: m < p, odd p, many micro-batches", 15, "schedule",
          cases("one_f_one_b", [(4, 2), (3, 5), (4, 8)], seed=300), visible.judge_real_ranks,
          timeout=30),
    Check("gpipe: more shapes, and its bubble equals the formula", 10, "schedule",
          cases("gpipe", grid((3, 5), (1, 2, 7)), seed=400), visible.judge_bubble_simulated),
]
