"""ZeRO stages 1 and 2: an optimizer whose state (and, in stage 2, gradients) is sharded
across the data-parallel ranks.

Rajbhandari et al., "ZeRO", SC 2020, §5.1-5.2. Each of N_d ranks owns 1/N_d of the parameters'
optimizer state, so with mixed-precision Adam a rank holds 4Ψ + 12Ψ/N_d bytes (stage 1) or
2Ψ + 14Ψ/N_d (stage 2) instead of 16Ψ (`toolkit.memory.model_state_bytes`). One step:

    stage 1   all-reduce the full gradient     → step on my shard → all-gather the parameters
    stage 2   reduce-scatter the gradient      → step on my shard → all-gather the parameters
              (only my shard's gradient is kept)

Both move 2Ψ per rank per step on a ring, as plain data parallelism does (ZeRO §7.2.1).

Sharding is *flat*: the trainable parameters of each param group are copied into one 1-D buffer,
padded to N_d·⌈Ψ/N_d⌉ elements, and the module's parameters become views into it. Rank r owns
the contiguous slice [r·S, (r+1)·S), S = ⌈Ψ/N_d⌉, so every rank holds the same number of
elements whatever the parameter shapes. (torch's `ZeroRedundancyOptimizer` assigns whole
parameters to ranks instead, which leaves the shards uneven: see PLATFORM_FACTS.md.) The inner
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

from ..memory import shard_numel


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

    ``ShardedOptimizer(params, optimizer_class, *, stage=1, process_group=None, **defaults)``
    mirrors `torch.distributed.optim.ZeroRedundancyOptimizer`: `defaults` go to
    `optimizer_class`, param groups keep their own options, and learning-rate schedulers may
    change ``param_groups[i]["lr"]`` (copied to the inner optimizer at every step). Parameters
    with ``requires_grad=False`` are left alone. `state` is the inner optimizer's state of this
    rank's shard only; `state_dict()` is that shard's too.
    """

    def __init__(self, params: Iterable[Any], optimizer_class: type[torch.optim.Optimizer], *,
                 stage: int = 1, process_group: Any = None, **defaults: Any) -> None:
        if stage not in (1, 2):
            raise ValueError(f"ShardedOptimizer: stage must be 1 or 2, got {stage!r} "
                             "(stage 3 shards the parameters too: use FullyShardedDataParallel)")
        if not dist.is_initialized():
            raise RuntimeError("ShardedOptimizer: torch.distributed is not initialised "
                               "(run inside toolkit.launch.spawn)")
        super().__init__(params, defaults)
        self.stage, self.group = stage, process_group
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
        refilled where a .grad was replaced or dropped; stage 2: a fresh one)."""
        flat = self.flats[i]
        buffer = self._grad_flats[i]
        if buffer is None:
            buffer = torch.zeros_like(flat.flat)
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
        """Average gradients (all-reduce or reduce-scatter), step on the local shard, and
        all-gather the updated parameters into every rank's flat buffer."""
        loss = closure() if closure is not None else None
        for i, (flat, group, inner) in enumerate(zip(self.flats, self.param_groups,
                                                     self.optim.param_groups)):
            inner.update(_options(group))  # learning-rate schedulers write to our groups
            shard = inner["params"][0]
            grad = self._flat_gradient(i)
            if self.stage == 1:
                dist.all_reduce(grad, group=self.group)  # ring: 2(N-1)/N · Ψ per rank
                grad.div_(self.world_size)  # every .grad window now holds the mean gradient
                shard.grad = flat.local(grad)
            else:
                mine = grad.new_empty(flat.shard_numel)
                dist.reduce_scatter_tensor(mine, grad, group=self.group)  # (N-1)/N · Ψ
                del grad  # the full gradient is gone from here on
                mine.div_(self.world_size)
                if shard.grad is not None:
                    mine += shard.grad  # no zero_grad since the last step: accumulate, as torch
                shard.grad = mine
        self.optim.step()
        for flat in self.flats:
            # Ring all-gather, (N-1)/N · Ψ per rank. The input is copied out first: passing a
            # view of the output itself leaves it to the backend to cope with the aliasing.
            dist.all_gather_into_tensor(flat.flat, flat.local(flat.flat).clone(), group=self.group)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear gradients. Stage 1 zeroes its flat gradient buffer in place (the parameters'
        .grad stay windows on it); stage 2 drops the shard gradients and any full ones."""
        for flat, buffer, inner in zip(self.flats, self._grad_flats, self.optim.param_groups):
            if buffer is not None:
                buffer.zero_()
                for p, window in flat.slots(buffer):
                    p.grad = window
            else:
                for p in flat.params:
                    p.grad = None
                inner["params"][0].grad = None

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


__all__ = ["FlatShard", "ShardedOptimizer"]
