"""Lab 04's hidden checks: more shapes (m < p, p = 1, odd p), per-stage memory, the simulated
bubble, and more real runs; ZB-H1 at other shapes (memory for m < p too), its bubble with
unequal F, B and W times, and on real ranks. Instructors only (`autograder release` leaves this
folder out)."""

from __future__ import annotations

import sys

from autograder.lab import Check

visible = sys.modules["_autograder_lab_04_pipeline_schedule_checks"]
cases, grid, zb_cases = visible.cases, visible.grid, visible.zb_cases
ZB_SHAPES = [(2, 2), (3, 5), (5, 7), (6, 12)]   # m >= p: where the paper's count holds

CHECKS = [
    Check("one_f_one_b: valid and within min(p − r, m) in flight for p 1-6, m 1-16", 16,
          "schedule", cases("one_f_one_b", grid((1, 2, 3, 4, 6), (1, 2, 3, 5, 8, 16)), seed=100),
          visible.judge_in_flight),
    Check("one_f_one_b: simulated bubble no larger than (p−1)/(m+p−1)", 12, "schedule",
          cases("one_f_one_b", grid((2, 3, 4, 8), (1, 4, 7, 16)), seed=200),
          visible.judge_bubble_simulated),
    Check("one_f_one_b on real ranks: m < p, odd p, many micro-batches", 12, "schedule",
          cases("one_f_one_b", [(4, 2), (3, 5), (4, 8)], seed=300), visible.judge_real_ranks,
          timeout=30),
    Check("gpipe: more shapes, and its bubble equals the formula", 8, "schedule",
          cases("gpipe", grid((3, 5), (1, 2, 7)), seed=400), visible.judge_bubble_simulated),
    Check("zb_h1: valid and within 1F1B's memory for p 1-6, m 1-16 (also m < p)", 5, "schedule",
          zb_cases(grid((1, 2, 3, 5, 6), (1, 2, 4, 7, 16)), seed=500), visible.judge_zb_memory),
    # t_W <= min(t_F, t_B): where W fills the drain exactly (the paper's assumption; with a
    # longer W the simulator's bubble exceeds the count).
    Check("zb_h1: the paper's bubble with unequal F, B and W times", 4, "schedule",
          zb_cases(ZB_SHAPES, (2.0, 1.0, 1.0), seed=600)
          + zb_cases(ZB_SHAPES, (1.0, 2.0, 1.0), seed=610)
          + zb_cases(ZB_SHAPES, (1.5, 1.0, 0.5), seed=620), visible.judge_zb_bubble),
    Check("zb_h1 on real ranks: m < p on four stages, and two stages", 3, "schedule",
          zb_cases([(4, 2), (2, 5)], seed=700), visible.judge_zb_real_ranks, timeout=30),
]
