"""ZeRO stages 1 and 2: an optimizer whose state (and, in stage 2, gradients) is sharded
across the data-parallel ranks.

Rajbhandari et al., "ZeRO", SC 2020, §5.1-5.2 and §7.2.1. Each of N_d ranks owns 1/N_d of the
parameters' optimizer state, so with mixed-precision Adam a rank holds 4Ψ + 12Ψ/N_d bytes
(stage 1) or 2Ψ + 14Ψ/N_d (stage 2) instead of 16Ψ (`toolkit.memory.model_state_bytes`). One
step, with the elements each rank sends on a ring (lesson 02: (N−1)/N·Ψ per reduce-scatter or
all-gather, twice that per all-reduce):

    stage 1   reduce-scatter the gradient → step on my shard → all-gather the parameters   2Ψ
    stage 2   reduce-scatter the gradient → step on my shard → all-gather the parameters   2Ψ
              (only my shard's gradient is kept)
    naive 1   all-reduce the full gradient → step on my shard → all-gather the parameters  3Ψ
              (``reduce="all_reduce"``: the all-gather half of the all-reduce delivers
              gradient slices the rank then ignores)

Stages 1 and 2 thus move 2Ψ per rank per step, as plain data parallelism does (ZeRO §7.2.1;
DeepSpeed's `reduce_scatter` option); the naive stage 1 moves 3Ψ, 1.5×. Stage 1 differs from
stage 2 in memory only: it keeps the full gradient buffer between steps. With the
reduce-scatter, that buffer holds this rank's *own* (un-averaged) gradients; the mean exists
only for the rank's shard, inside `step()`. With ``reduce="all_reduce"`` every ``.grad`` holds
the mean after `step()`.

Sharding is *flat*: the trainable parameters of each param group are copied into one 1-D buffer,
padded to N_d·⌈Ψ/N_d⌉ elements, and the module's parameters become views into it. Rank r owns
the contiguous slice [r·S, (r+1)·S), S = ⌈Ψ/N_d⌉, so every rank holds the same number of
elements whatever the parameter shapes. (torch's `ZeroRedundancyOptimizer` instead "uses a
sorted-greedy algorithm to pack a number of parameters at each rank. Each parameter belongs to a
single rank and is not divided among ranks" (its docstring), so a model of a few large and many
small tensors gets uneven shards.) The inner
optimizer steps on the shard as if it were one parameter, which equals stepping every parameter
for element-wise optimizers (SGD, Adam, AdamW); not for those that look at a whole tensor
(LAMB, Adafactor) or at the global gradient norm.

    model = TinyMLP()
    opt = ShardedOptimizer(model.parameters(), torch.optim.Adam, stage=2, lr=1e-3)
    loss_fn(model(x), y).backward(); opt.step(); opt.zero_grad()

Stage 2 here reduce-scatters the whole flat gradient in `step()`, then frees the full
gradients: between steps a rank holds only its shard's gradient, but the full gradient exists
from backward to step. DeepSpeed reduces bucket by bucket *during* backward so it never does.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..comm.flat import gather_into, reduce_scatter_into
from ..memory import shard_numel

REDUCE = ("reduce_scatter", "all_reduce")
"""How `ShardedOptimizer` averages gradients: reduce-scatter (2Ψ per step with the all-gather),
or all-reduce (the naive stage 1, 3Ψ)."""


class FlatShard:
    """Parameters copied into one padded flat buffer they then view; rank r owns slice r."""

    def __init__(self, params: list[nn.Parameter], world_size: int, rank: int) -> None:
        dtypes = {p.dtype for p in params}
        if len(dtypes) > 1:
            raise ValueError(f"FlatShard: one param group must hold one dtype, got {dtypes}")
        self.params = params
        self.numel = sum(p.numel() for p in params)
        self.shard_numel = shard_numel(self.numel, world_size)
        self.padding = world_size * self.shard_numel - self.numel
        dtype = params[0].dtype if params else torch.float32
        # On the parameters' device: `p.data = self.flat[...]` below would otherwise move CUDA
        # parameters to the CPU.
        device = params[0].device if params else None
        self.flat = torch.zeros(world_size * self.shard_numel, dtype=dtype, device=device)
        self.offsets: list[int] = []
        offset = 0
        with torch.no_grad():
            for p in params:
                self.flat[offset:offset + p.numel()].copy_(p.reshape(-1))
                # From now on the module's parameter *is* a window on the flat buffer, so an
                # all-gather into the buffer updates the model with no copy.
                p.data = self.flat[offset:offset + p.numel()].view_as(p)
                self.offsets.append(offset)
                offset += p.numel()
        lo = rank * self.shard_numel
        self.bounds = (lo, lo + self.shard_numel)

    def local(self, flat: Tensor) -> Tensor:
        """This rank's slice of a flat buffer (a view)."""
        return flat[self.bounds[0]:self.bounds[1]]

    def slots(self, flat: Tensor) -> Iterable[tuple[nn.Parameter, Tensor]]:
        """(parameter, its window on `flat`, shaped like it) for every parameter."""
        for p, offset in zip(self.params, self.offsets):
            yield p, flat[offset:offset + p.numel()].view_as(p)


class ShardedOptimizer(torch.optim.Optimizer):
    """ZeRO stage 1 or 2 around any `torch.optim` class (module docstring).

    ``ShardedOptimizer(params, optimizer_class, *, stage=1, reduce="reduce_scatter",
    process_group=None, **defaults)`` mirrors `torch.distributed.optim.ZeroRedundancyOptimizer`:
    `defaults` go to `optimizer_class`, param groups keep their own options, and learning-rate
    schedulers may change ``param_groups[i]["lr"]`` (copied to the inner optimizer at every
    step). Parameters with ``requires_grad=False`` are left alone. `state` is the inner
    optimizer's state of this rank's shard only; `state_dict()` is that shard's too.
    ``reduce="all_reduce"`` (stage 1 only) is the naive variant of the module docstring.
    """

    def __init__(self, params: Iterable[Any], optimizer_class: type[torch.optim.Optimizer], *,
                 stage: int = 1, reduce: str = "reduce_scatter", process_group: Any = None,
                 **defaults: Any) -> None:
        if stage not in (1, 2):
            raise ValueError(f"ShardedOptimizer: stage must be 1 or 2, got {stage!r} "
                             "(stage 3 shards the parameters too: use FullyShardedDataParallel)")
        if reduce not in REDUCE or (stage == 2 and reduce != "reduce_scatter"):
            raise ValueError(f"ShardedOptimizer: reduce must be one of {REDUCE} (all_reduce "
                             f"only at stage 1, the naive variant), got {reduce!r} at stage "
                             f"{stage}")
        if not dist.is_initialized():
            raise RuntimeError("ShardedOptimizer: torch.distributed is not initialised "
                               "(run inside toolkit.launch.spawn)")
        super().__init__(params, defaults)
        self.stage, self.reduce, self.group = stage, reduce, process_group
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        self.flats: list[FlatShard] = []
        self._grad_flats: list[Tensor | None] = []
        inner_groups = []
        for group in self.param_groups:
            flat = FlatShard([p for p in group["params"] if p.requires_grad],
                             self.world_size, self.rank)
            # The shard is an nn.Parameter sharing the flat buffer's storage: the inner
            # optimizer's in-place update writes straight into the model.
            shard = nn.Parameter(flat.local(flat.flat))
            self.flats.append(flat)
            inner_groups.append({**_options(group), "params": [shard]})
            grad_flat = None
            if stage == 1:
                # Stage 1 keeps the full gradient: make every .grad a window on one flat buffer
                # that autograd accumulates into in place, so the all-reduce needs no copy.
                grad_flat = torch.zeros_like(flat.flat)
                for p, window in flat.slots(grad_flat):
                    p.grad = window
            self._grad_flats.append(grad_flat)
        self.optim = optimizer_class(inner_groups, **defaults)
        self.state = self.optim.state  # what memory measurement and users inspect

    def _flat_gradient(self, i: int) -> Tensor:
        """Group i's full gradient as one padded flat tensor (stage 1: the persistent buffer,
        made again after zero_grad(set_to_none=True), refilled where a .grad was replaced or
        dropped; stage 2: a fresh one)."""
        flat = self.flats[i]
        buffer = self._grad_flats[i]
        if buffer is None:
            buffer = torch.zeros_like(flat.flat)
            if self.stage == 1:
                self._grad_flats[i] = buffer
        for p, window in flat.slots(buffer):
            if p.grad is None:
                window.zero_()  # unused this step (or zero_grad(set_to_none=True)): no gradient
            elif p.grad.data_ptr() != window.data_ptr():
                window.copy_(p.grad)
            if self.stage == 1:
                p.grad = window
            else:
                p.grad = None  # stage 2 keeps only the shard's gradient (set in step)
        return buffer

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        """Average gradients (reduce-scatter, or all-reduce in the naive stage 1), step on the
        local shard, and all-gather the updated parameters into every rank's flat buffer."""
        loss = closure() if closure is not None else None
        for i, (flat, group, inner) in enumerate(zip(self.flats, self.param_groups,
                                                     self.optim.param_groups)):
            inner.update(_options(group))  # learning-rate schedulers write to our groups
            shard = inner["params"][0]
            grad = self._flat_gradient(i)
            if self.reduce == "all_reduce":
                dist.all_reduce(grad, group=self.group)  # ring: 2(N-1)/N · Ψ per rank
                grad.div_(self.world_size)  # every .grad window now holds the mean gradient
                shard.grad = flat.local(grad)
                continue
            mine = grad.new_empty(flat.shard_numel)
            reduce_scatter_into(mine, grad, group=self.group)  # (N-1)/N · Ψ
            mine.div_(self.world_size)
            if self.stage == 2:
                del grad  # the full gradient is gone from here on
                if shard.grad is not None:
                    mine += shard.grad  # no zero_grad since the last step: accumulate, as torch
            # Stage 1 keeps its buffer of local gradients untouched: without zero_grad the next
            # backward adds to them, and the next reduce-scatter averages the sums, as torch.
            shard.grad = mine
        self.optim.step()
        if self.stage == 1 and self.reduce == "reduce_scatter":
            for inner in self.optim.param_groups:
                inner["params"][0].grad = None  # the shard's mean was only for this step
        for flat in self.flats:
            # Ring all-gather, (N-1)/N · Ψ per rank. The input is copied out first: passing a
            # view of the output itself leaves it to the backend to cope with the aliasing.
            gather_into(flat.flat, flat.local(flat.flat).clone(), group=self.group)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear gradients, as `torch.optim.Optimizer.zero_grad` does.

        ``set_to_none=True``: every parameter's and shard's ``.grad`` becomes None, and stage 1
        frees its flat gradient buffer too (the next `step` builds it again from autograd's
        gradients), so no gradient bytes are held until the next backward.
        ``set_to_none=False``: gradients are zeroed in place; stage 1 keeps its buffer and the
        parameters' ``.grad`` stay windows on it, so backward accumulates into it with no copy.
        """
        for i, (flat, inner) in enumerate(zip(self.flats, self.optim.param_groups)):
            shard = inner["params"][0]
            buffer = self._grad_flats[i]
            if set_to_none:
                self._grad_flats[i] = None
                for p in flat.params:
                    p.grad = None
                shard.grad = None
                continue
            if buffer is not None:
                buffer.zero_()
                for p, window in flat.slots(buffer):
                    p.grad = window
            else:
                for p in flat.params:
                    if p.grad is not None:
                        p.grad.zero_()
            if shard.grad is not None:
                shard.grad.zero_()

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Groups are flattened once, at construction; adding one later is not supported."""
        if hasattr(self, "flats"):
            raise NotImplementedError("ShardedOptimizer: pass every param group to the "
                                      "constructor (they are flattened there)")
        super().add_param_group(param_group)

    def state_dict(self) -> dict[str, Any]:
        """The inner optimizer's state dict: this rank's shard only."""
        return self.optim.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict saved by `state_dict` on the same rank and world size."""
        self.optim.load_state_dict(state_dict)


def _options(group: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in group.items() if k != "params"}


__all__ = ["REDUCE", "FlatShard", "ShardedOptimizer"]
