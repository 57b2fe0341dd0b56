"""Lab 06's hidden checks: other shapes and rules, NaN instead of inf, 3 and 4 ranks, a
parameter without gradient, growth between overflows on two ranks, the bf16 bytes of every
step of a training run, and the state dict at other points. Instructors only (`autograder
release` leaves this folder out)."""

from __future__ import annotations

import sys

from autograder.lab import Check

visible = sys.modules["_autograder_lab_06_mixed_precision_checks"]
case, TRAIN = visible.case, visible.TRAIN

CHECKS = [
    Check("master_copy and copy_to_working: 3 ranks, four shapes", 5, "masters",
          (case("masters", 3, 100, shapes=[[2, 3, 4], [7], [1], [5, 5]]),),
          visible.judge_masters),
    Check("LossScaler: other rules (growth ×4, backoff ×0.25, every step; static scale)", 8,
          "scaler",
          (case("scaler", 1, 110, init_scale=8.0, growth_factor=4.0, backoff_factor=0.25,
                growth_interval=1, flags=[False, True, True, False, False, True], split=2),
           case("scaler", 1, 111, init_scale=128.0, growth_factor=1.0, backoff_factor=1.0,
                growth_interval=2, flags=[True, False, False, True], split=3),
           case("scaler", 1, 112, init_scale=2.0 ** 10, growth_interval=2,
                flags=[False, True, False, False, False, False, True], split=1)),
          visible.judge_scaler),
    Check("LossScaler.unscale_: NaN on the last rank, a parameter without gradient, 3 ranks", 10,
          "unscale",
          (case("unscale", 3, 120, shapes=[[3, 3], [2], [4]], scale=2.0 ** 14, bad=[2, "nan"],
                none=1),
           case("unscale", 3, 121, shapes=[[6]], scale=1.0, bad=None)),
          visible.judge_unscale, timeout=30),
    Check("all_reduce_gradients: 3 and 4 ranks, a parameter without gradient", 10, "reduce",
          (case("reduce", 3, 130, shapes=[[2, 7], [7], [3, 3]], none=1),
           case("reduce", 4, 131, shapes=[[16, 8], [8]])),
          visible.judge_reduce, timeout=30),
    Check("train_step: 4 ranks, overflows on two ranks with growth between, bf16 bytes", 17,
          "train",
          (case("train", 4, 140, **{**TRAIN, "steps": 6, "growth_interval": 2,
                                     "overflow": [[0, 3], [4, 1]]}),),
          visible.judge_train_bytes, timeout=60),
    Check("train_step: 3 ranks, bigger layer, a skipped first step", 10, "train",
          (case("train", 3, 150, **{**TRAIN, "d_in": 10, "d_out": 5, "batch": 3,
                                     "overflow": [[0, 0]]}),),
          visible.judge_train, timeout=60),
]
