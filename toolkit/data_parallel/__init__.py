"""Data parallelism, from gradient accumulation to fully sharded training.

One module per idea, the simple version beside the optimised one (see docs/architecture.md):
gradient accumulation and DDP (naive, bucketed, overlapped) in `accumulation` and `ddp`; the
ZeRO-1/2 sharded optimizer in `zero`; FSDP (ZeRO-3) in `fsdp`; HSDP (shard within a group,
replicate across groups) in `hsdp`; one FSDP step simulated on paper in `fsdp_schedule`. Each
is checked against a single-process run on the tiny models of `toolkit.models`.
"""

from .accumulation import accumulate_gradients, split_batch
from .buckets import Bucket, assign_buckets
from .ddp import BucketedDDP, NaiveDDP, OverlappedDDP, broadcast_module
from .fsdp import FlatGroup, FullyShardedDataParallel
from .fsdp_schedule import StepSchedule, ring_wire_bytes, simulate_step
from .hsdp import HybridLayout, HybridShardedDataParallel, hybrid_groups
from .zero import FlatShard, ShardedOptimizer

__all__ = ["Bucket", "BucketedDDP", "FlatGroup", "FlatShard", "FullyShardedDataParallel",
           "HybridLayout", "HybridShardedDataParallel", "NaiveDDP", "OverlappedDDP",
           "ShardedOptimizer", "StepSchedule", "accumulate_gradients", "assign_buckets",
           "broadcast_module", "hybrid_groups", "ring_wire_bytes", "simulate_step", "split_batch"]
