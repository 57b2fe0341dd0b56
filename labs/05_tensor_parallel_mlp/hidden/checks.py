"""Lab 05's hidden checks: float64, inputs of one to three leading dimensions, layers without
bias, 3 ranks, one hidden unit per rank, the MLP's traffic in bytes, and each rank holding only
its shard. Instructors only (`autograder release` leaves this folder out)."""

from __future__ import annotations

import sys

from autograder.lab import Check

visible = sys.modules["_autograder_lab_05_tensor_parallel_mlp_checks"]
cases = visible.cases

CHECKS = [
    Check("f and g: float64, 2-D and 4-D inputs, 3 ranks", 8, "fg",
          cases("fg", (3,), ((5,), (2, 3, 2)), h=6, dtype="float64", seed=100),
          visible.judge_fg),
    Check("ColumnParallelLinear: no bias, 2-D and 3-D inputs, float64, 4 ranks", 6, "column",
          cases("column", (4,), ((6,), (3, 5)), h=12, d=20, dtype="float64", bias=False, seed=110)
          + cases("column", (4,), ((1, 7),), h=4, d=4, seed=115),
          visible.judge_layer),
    Check("RowParallelLinear: no bias, 2-D and 3-D inputs, float64, 4 ranks", 6, "row",
          cases("row", (4,), ((6,), (3, 5)), h=20, d=12, dtype="float64", bias=False, seed=120)
          + cases("row", (4,), ((1, 7),), h=4, d=4, seed=125),
          visible.judge_layer),
    Check("ParallelMLP: 2, 3 and 4 ranks, one hidden unit per rank, no bias, float64", 20, "mlp",
          cases("mlp", (2,), ((4,), (2, 2, 3)), h=6, d=2, seed=130)
          + cases("mlp", (3,), ((3, 5),), h=9, d=12, dtype="float64", seed=140)
          + cases("mlp", (4,), ((2, 6),), h=16, d=64, bias=False, seed=150)
          + cases("mlp", (4,), ((2, 5),), h=12, d=48, dtype="float64", seed=155),
          visible.judge_mlp),
    Check("ParallelMLP: one all-reduce of one (.., h) activation each way, 4 ranks", 10,
          "mlp", cases("mlp", (4,), ((2, 4),), h=6, d=24, seed=160)
          + cases("mlp", (4,), ((4, 8),), h=32, d=128, dtype="float64", seed=170),
          visible.judge_mlp_traffic),
    Check("ParallelMLP: each rank holds only its shard ((h·d + d)/p + d·h/p + h elements)", 10,
          "mlp", cases("mlp", (2,), h=8, d=32, seed=180) + cases("mlp", (2,), h=8, d=32,
                                                                  bias=False, seed=185),
          visible.judge_mlp_memory),
]
