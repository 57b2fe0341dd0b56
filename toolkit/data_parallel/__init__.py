"""Data parallelism, from gradient accumulation to fully sharded training.

One module per idea, the simple version beside the optimised one (see docs/architecture.md):
gradient accumulation and DDP (naive, bucketed, overlapped) in `accumulation` and `ddp`; the
ZeRO-1/2 sharded optimizer in `zero`; FSDP (ZeRO-3) in `fsdp`. Each is checked against a
single-process run on the tiny models of `toolkit.models`.
"""

from .fsdp import FlatGroup, FullyShardedDataParallel
from .zero import FlatShard, ShardedOptimizer

__all__ = ["FlatGroup", "FlatShard", "FullyShardedDataParallel", "ShardedOptimizer"]
