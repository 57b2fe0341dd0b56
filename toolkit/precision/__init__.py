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
`fp8`              fp8 casts that saturate, per-tensor scales (Transformer Engine's delayed
                   scaling with an amax history, current scaling), OCP MX blocks of 32 with E8M0
                   scales, DeepSeek-V3's 1×128 / 128×128 blocks, `scaled_matmul` (torch's fp8
                   GEMM, ``torch._scaled_mm``)
`fp8_linear`       `Fp8Linear` / `use_fp8`: a linear layer's three GEMMs on fp8 inputs per recipe,
                   emulated (fp8 training of TinyGPT on a CPU)
`accumulate`       `round_to_bits`, `tf32`, `accumulated_matmul` (a running sum of m bits, with
                   DeepSeek-V3's promotion to fp32 every N_C terms), `relative_error`
=================  ===============================================================================

The formats' arithmetic (ranges, spacing, what a cast keeps) is pure and lives in
`toolkit.formats`; the runs on ranks measured against `toolkit.memory` live in
`toolkit.experiments.memory` (``precision="mixed"``).
"""

from . import accumulate, fp8
from .autocast import OpRecord, autocast_policy, record_op_dtypes
from .fp8_linear import Fp8Linear, Fp8Recipe, use_fp8
from .master import MasterWeightOptimizer, copy_to_working, master_copy, master_weights
from .scaler import DynamicLossScaler, next_scale
from .step import StepResult, all_reduce_gradients, data_parallel_step
from .underflow import Gradients, flushed, scaled_gradients

__all__ = ["DynamicLossScaler", "Fp8Linear", "Fp8Recipe", "Gradients", "MasterWeightOptimizer",
           "OpRecord", "StepResult", "accumulate", "all_reduce_gradients", "autocast_policy",
           "copy_to_working", "data_parallel_step", "flushed", "fp8", "master_copy",
           "master_weights", "next_scale", "record_op_dtypes", "scaled_gradients", "use_fp8"]
