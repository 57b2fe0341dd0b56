"""Experiments: run the algorithms on real ranks, measure, and set the models' predictions beside.

The models (`toolkit.cost`, `toolkit.memory`, `toolkit.flops`, `toolkit.planner`) are pure
numbers and start no process; the algorithms (`toolkit.collectives`, `toolkit.data_parallel`,
`toolkit.tensor_parallel`, ...) run inside ranks. What checks one against the other imports
both, so it lives here, in one place, above them:

================  =================================================================================
module            holds
================  =================================================================================
`collectives`     `measure`: nccl-tests-style sweep of collectives over sizes and world sizes, a
                  table to fit α and β to (`toolkit.cost.fit_alpha_beta`)
`flops`           `measure_step`: one TinyGPT step counted (FlopCounterMode) and timed, beside
                  `toolkit.flops.step_flops`; recomputation included
`memory`          `run_methods`: DDP, ZeRO-1/2, our FSDP and torch's FSDP2 trained on ranks, the
                  bytes each rank holds and sends; `predicted_rows` sets `toolkit.memory`'s
                  formulas beside them
`planner`         `run_layout`: TinyGPT steps on ranks under a dp × tp layout; `calibrate`:
                  this machine's rates per kind of op, the glue of a micro-batch and the
                  all-reduce's α-β per group size (a `toolkit.planner.Calibration`), measured on
                  the same ranks as the layouts' steps, in core and clock time
`planner_ops`     the benches `calibrate` runs: every op of a step alone at its size, operands
                  out of cache (`OperandPool`), the all-reduce's mean CPU cost per call
================  =================================================================================

Import a module by name (``from toolkit.experiments.collectives import measure``): this package
imports none of them, so using one does not load the others' algorithms.
"""
