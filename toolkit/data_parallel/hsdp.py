"""Hybrid sharded data parallelism (HSDP): FSDP within a group, plain replication across groups.

Zhao et al., "PyTorch FSDP", VLDB 2023, §3.2.2 ("hybrid sharding"). The W = R·S ranks form a
grid of R replicas × S shards. Rank w = r·S + s holds shard s of every unit; ranks with the same
s in different replicas hold the *same* shard. Per unit and step:

    forward    all-gather the unit within my shard group (S ranks)      (S−1)/S · Ψ_unit
    backward   all-gather again, reduce-scatter the gradient within it  2 × (S−1)/S · Ψ_unit
               all-reduce my gradient shard across my replica group      2(R−1)/R · Ψ_unit/S

so parameters and optimizer state cost 16Ψ/S bytes per rank (not 16Ψ/W), but the all-gathers,
the traffic that grows with the model, stay inside S ranks (one node, a fast link), and what
crosses the slower links between replicas is a ring all-reduce of each rank's gradient shard:
2(R−1)/R · Ψ/S elements sent per rank and step. That equals Ψ/S only at R = 2 and tends to
2Ψ/S as R grows (DDP's 2(R−1)/R on a model S times smaller).

    layout = HybridLayout(world_size=4, shard_size=2)          # 2 replicas × 2 shards
    model = HybridShardedDataParallel(TinyMLP(), layout)       # collective: every rank calls it
    opt = torch.optim.SGD(model.parameters(), lr=0.1)          # the shards
    loss.backward(); opt.step()                                 # mean gradient over all 4 ranks

Built on `FullyShardedDataParallel` with the shard group as its process group: its
reduce-scatter leaves the mean over the S shard ranks in each shard's ``.grad``; a second
gradient hook on each unit's gathered buffer then all-reduces that shard gradient over the R
replicas and divides by R, unit by unit during backward (as torch's HSDP does), giving the mean
over all W ranks. Gradient accumulation works: a backward's new gradient is reduced alone and
added to what earlier backwards left.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import torch
import torch.distributed as dist
from torch import Tensor, nn

from .fsdp import FlatGroup, FullyShardedDataParallel


@dataclass(frozen=True)
class HybridLayout:
    """The R × S rank grid of HSDP: rank w sits in replica w // S at shard index w % S."""

    world_size: int
    """All ranks, W = R·S."""
    shard_size: int
    """S: ranks that split one copy of the model between them (one shard group)."""

    def __post_init__(self) -> None:
        if self.shard_size < 1 or self.world_size < 1 or self.world_size % self.shard_size:
            raise ValueError(f"HybridLayout: shard_size must divide world_size (R × S ranks), "
                             f"got world_size={self.world_size}, shard_size={self.shard_size}")

    @property
    def replicas(self) -> int:
        """R: how many full copies of the (sharded) model exist."""
        return self.world_size // self.shard_size

    def shard_group_ranks(self) -> list[list[int]]:
        """Each replica's ranks, e.g. [[0, 1], [2, 3]] for 2 × 2: the all-gathers run here."""
        S = self.shard_size
        return [list(range(r * S, (r + 1) * S)) for r in range(self.replicas)]

    def replicate_group_ranks(self) -> list[list[int]]:
        """Ranks holding the same shard, e.g. [[0, 2], [1, 3]]: the gradient all-reduce runs
        here."""
        S = self.shard_size
        return [list(range(s, self.world_size, S)) for s in range(S)]


def hybrid_groups(layout: HybridLayout) -> tuple[Any, Any]:
    """(shard group, replicate group) of this rank. A collective: every rank creates every
    group, in the same order, as `dist.new_group` requires."""
    if dist.get_world_size() != layout.world_size:
        raise ValueError(f"hybrid_groups: the layout has {layout.world_size} ranks, "
                         f"the process group {dist.get_world_size()}")
    rank = dist.get_rank()
    mine: dict[str, Any] = {}
    for kind, lists in (("shard", layout.shard_group_ranks()),
                        ("replicate", layout.replicate_group_ranks())):
        for ranks in lists:
            group = dist.new_group(ranks)
            if rank in ranks:
                mine[kind] = group
    return mine["shard"], mine["replicate"]


class HybridShardedDataParallel(FullyShardedDataParallel):
    """FSDP over this rank's shard group, gradients all-reduced over its replicate group
    (module docstring). ``parameters()`` are the local shards (1/S of each unit);
    ``full_state_dict()`` gathers within the shard group."""

    def __init__(self, module: nn.Module, layout: HybridLayout,
                 units: Iterable[nn.Module] | None = None, *,
                 compute_dtype: torch.dtype | None = None, prefetch: bool = False) -> None:
        if not dist.is_initialized():
            raise RuntimeError("HybridShardedDataParallel: torch.distributed is not initialised "
                               "(run inside toolkit.launch.spawn)")
        shard_group, replicate_group = hybrid_groups(layout)
        super().__init__(module, units, compute_dtype=compute_dtype, prefetch=prefetch,
                         process_group=shard_group)
        self.layout, self.replicate_group = layout, replicate_group
        # Gradient this rank's shards held before the current backward (accumulation), parked
        # so that each unit's hook reduces only the new gradient.
        self._earlier: dict[int, Tensor | None] = {}
        for g in self._all_groups():
            if g.trainable:
                # Registered after FSDP's own hook, so it runs after the reduce-scatter.
                g.full.register_post_accumulate_grad_hook(
                    lambda full, g=g: self._all_reduce_replicas(g))

    def _on_backward(self) -> None:
        if not self._backward_queued:  # the first gradient of a new backward: park old ones
            self._earlier = {}
            for g in self._all_groups():
                if g.trainable:
                    self._earlier[id(g)] = g.shard.grad
                    g.shard.grad = None
        super()._on_backward()

    def _all_reduce_replicas(self, g: FlatGroup) -> None:
        """After the shard group's reduce-scatter: mean over replicas, plus earlier gradient."""
        grad = g.shard.grad  # the mean over my shard group of this backward's gradient
        if self.layout.replicas > 1:
            dist.all_reduce(grad, group=self.replicate_group)  # ring: 2(R−1)/R · Ψ_unit/S
            grad.div_(self.layout.replicas)
        earlier = self._earlier.pop(id(g), None)
        if earlier is not None:
            grad += earlier

    def _end_backward(self) -> None:
        # Units that took no gradient in this backward keep what they had.
        for g in self._all_groups():
            if id(g) in self._earlier:
                g.shard.grad = self._earlier.pop(id(g))
        super()._end_backward()


__all__ = ["HybridLayout", "HybridShardedDataParallel", "hybrid_groups"]
