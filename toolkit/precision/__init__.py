"""Mixed-precision training pieces that run inside ranks (lesson 05; lab 06 builds on them).

Micikevicius et al., "Mixed Precision Training", ICLR 2018: compute in 16 bits, keep fp32
master weights (§3.1), scale the loss so small fp16 gradients survive (§3.2). Bytes per
parameter with Adam: 2 (16-bit weights) + 2 (16-bit gradients) + 12 (fp32 master, momentum,
variance) = 16 (ZeRO §3.1; `toolkit.memory.MIXED_ADAM`).

=================  ===============================================================================
module             holds
=================  ===============================================================================
`master`           `master_copy`, `copy_to_working`, `MasterWeightOptimizer` (any torch optimizer
                   over fp32 masters of 16-bit parameters; state dict with the masters),
                   `master_weights(optimizer_class)` to compose with `ShardedOptimizer`
`scaler`           `next_scale` (the dynamic rule, pure), `DynamicLossScaler` (scale, unscale
                   once, inf/NaN flag all-reduced so every rank skips the same step, backoff,
                   growth, state dict)
`step`             `all_reduce_gradients` (one flat all-reduce in a chosen dtype: bf16 halves the
                   bytes), `data_parallel_step` (forward, scaled backward, reduce, step or skip)
`autocast`         `record_op_dtypes` (which dtype each op of a real run computed in, from the
                   dispatcher), `autocast_policy` (lower precision / fp32 / input dtype)
`underflow`        `scaled_gradients` (one backward at a loss scale, parameter and activation
                   gradients unscaled), `flushed` (the zeros a 16-bit run adds)
=================  ===============================================================================

The formats' arithmetic (ranges, spacing, what a cast keeps) is pure and lives in
`toolkit.formats`; the runs on ranks measured against `toolkit.memory` live in
`toolkit.experiments.memory` (``precision="mixed"``).
"""

from .autocast import OpRecord, autocast_policy, record_op_dtypes
from .master import MasterWeightOptimizer, copy_to_working, master_copy, master_weights
from .scaler import DynamicLossScaler, next_scale
from .step import StepResult, all_reduce_gradients, data_parallel_step
from .underflow import Gradients, flushed, scaled_gradients

__all__ = ["DynamicLossScaler", "Gradients", "MasterWeightOptimizer", "OpRecord", "StepResult",
           "all_reduce_gradients", "autocast_policy", "copy_to_working", "data_parallel_step",
           "flushed", "master_copy", "master_weights", "next_scale", "record_op_dtypes",
           "scaled_gradients"]
