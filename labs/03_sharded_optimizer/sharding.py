"""Lab 03: a ZeRO sharded optimizer and the core of FSDP, from scratch.

Rajbhandari et al., "ZeRO", SC 2020, §5 (stage 2: shard the optimizer state and the gradients;
stage 3: the parameters too); Zhao et al., "PyTorch FSDP", VLDB 2023, §3 (per-unit all-gather,
free after use, reduce-scatter of gradients).

Everything is sharded *flat*: a list of tensors is concatenated into one 1-D vector of n
elements, zero-padded to p·S elements with S = ⌈n/p⌉, and rank r owns elements
[r·S, (r+1)·S) of it, so every rank holds the same number of elements whatever the shapes.

You may call these torch.distributed collectives on the default group: `all_gather_into_tensor`,
`reduce_scatter_tensor` (or `all_gather` / `reduce_scatter`, their list forms), `all_reduce`,
`broadcast` (in a constructor only). `toolkit.data_parallel` (the course's own
answers) is off limits: the grader refuses the import. Every rank trains on its own, equal
slice of the batch, so the gradient to apply is the *mean* over ranks.

Run `autograder grade .` in this folder to check your work; README.md explains each
check.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
import torch.distributed as dist
from torch import Tensor, nn


# -- 1. Flat, padded shards -------------------------------------------------------------------

def shard_bounds(numel: int, world_size: int, rank: int) -> tuple[int, int]:
    """(start, end) of rank `rank`'s shard in the padded flat vector of `numel` elements:
    S = ⌈numel / world_size⌉ elements each, rank r at [r·S, (r+1)·S). `end` may pass `numel`
    (those elements are padding)."""
    ### BEGIN SOLUTION
    size = -(-numel // world_size)  # ⌈numel / p⌉
    return rank * size, (rank + 1) * size
    ### END SOLUTION
    ### HINT: every rank gets the same S = ceil(numel / world_size) elements; rank r starts at r·S.


def flatten_padded(tensors: Iterable[Tensor], world_size: int) -> Tensor:
    """The tensors' elements one after another (each in ``reshape(-1)`` order), as one 1-D
    tensor of world_size·⌈n/world_size⌉ elements (n in total), the tail zeros."""
    ### BEGIN SOLUTION
    parts = [t.reshape(-1) for t in tensors]
    numel = sum(t.numel() for t in parts)
    out = torch.zeros(world_size * -(-numel // world_size),
                      dtype=parts[0].dtype if parts else torch.float32,
                      device=parts[0].device if parts else None)
    if parts:
        out[:numel] = torch.cat(parts)
    return out
    ### END SOLUTION
    ### HINT: torch.cat the flattened tensors into a zero tensor of the padded length.


# -- 2. ZeRO stage 2: a sharded optimizer ------------------------------------------------------

class ShardedOptimizer:
    """Wraps a torch optimizer so that each rank keeps the optimizer state of its shard only.

    ``ShardedOptimizer(model.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9)``. Parameters
    with ``requires_grad=False`` are left alone. One `step()`:

    1. flatten (and pad) every trainable parameter's gradient, reduce-scatter it: each rank gets
       the *mean* gradient of its own shard only;
    2. step the inner optimizer on this rank's shard of the parameters;
    3. all-gather the updated shards and copy the result back into the model's parameters.

    Attribute the grader reads: ``self.optimizer``, the inner torch optimizer (its state must
    cover this rank's shard only: about 1/p of what an unsharded optimizer holds).
    """

    def __init__(self, params: Iterable[nn.Parameter], optimizer_class: type, **defaults: Any):
        self.params = [p for p in params if p.requires_grad]
        self.world_size, self.rank = dist.get_world_size(), dist.get_rank()
        self.numel = sum(p.numel() for p in self.params)
        ### BEGIN SOLUTION
        flat = flatten_padded([p.detach() for p in self.params], self.world_size)
        start, end = shard_bounds(self.numel, self.world_size, self.rank)
        self.shard = nn.Parameter(flat[start:end].clone())  # my slice, a parameter of its own
        self.optimizer = optimizer_class([self.shard], **defaults)
        ### END SOLUTION
        ### HINT: keep a copy of your slice of the flat parameters as an nn.Parameter and build
        ### HINT: self.optimizer = optimizer_class([that slice], **defaults).

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        ### BEGIN SOLUTION
        p = self.world_size
        grads = [q.grad if q.grad is not None else torch.zeros_like(q) for q in self.params]
        flat_grad = flatten_padded(grads, p)
        mine = flat_grad.new_empty(flat_grad.numel() // p)
        dist.reduce_scatter_tensor(mine, flat_grad)  # the sum of my slice over the ranks
        self.shard.grad = mine / p                    # the mean: every rank had 1/p of the batch
        self.optimizer.step()
        full = torch.empty_like(flat_grad)
        dist.all_gather_into_tensor(full, self.shard.detach())
        offset = 0
        for q in self.params:
            q.copy_(full[offset:offset + q.numel()].view_as(q))
            offset += q.numel()
        ### END SOLUTION
        ### HINT: reduce_scatter_tensor(out, flat_grad) leaves the *sum* over ranks of your slice
        ### HINT: in `out`; the optimizer steps on your slice; all_gather_into_tensor rebuilds
        ### HINT: the flat vector, which you copy back parameter by parameter (mind the offsets).


# -- 3. FSDP: a fully sharded Linear layer -----------------------------------------------------

class FSDPLinear(nn.Module):
    """One FSDP unit: an ``nn.Linear`` whose weight and bias (in that order) live only as this
    rank's shard of their flat padded vector, ``self.shard`` (the parameter an optimizer
    steps). The full parameters exist only between `gather_params` and `release_params`:
    in forward, and again in backward (`GatheredLinear`)."""

    def __init__(self, linear: nn.Linear, world_size: int, rank: int) -> None:
        super().__init__()
        if linear.bias is None:
            raise ValueError("FSDPLinear: the Linear needs a bias")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.world_size, self.rank = world_size, rank
        self.numel = linear.weight.numel() + linear.bias.numel()
        flat = flatten_padded([linear.weight.detach(), linear.bias.detach()], world_size)
        start, end = shard_bounds(self.numel, world_size, rank)
        self.shard = nn.Parameter(flat[start:end].clone())
        self.full: Tensor | None = None
        """The gathered flat parameters (padded), or None while released."""

    def gather_params(self) -> tuple[Tensor, Tensor]:
        """All-gather every rank's shard into ``self.full`` and return (weight, bias) as views
        of it, shaped (out_features, in_features) and (out_features,)."""
        ### BEGIN SOLUTION
        self.full = self.shard.new_empty(self.world_size * self.shard.numel())
        dist.all_gather_into_tensor(self.full, self.shard.detach())
        n_weight = self.out_features * self.in_features
        weight = self.full[:n_weight].view(self.out_features, self.in_features)
        bias = self.full[n_weight:n_weight + self.out_features]
        return weight, bias
        ### END SOLUTION
        ### HINT: all_gather_into_tensor(out, shard) puts rank r's shard at out[r·S:(r+1)·S].

    def release_params(self) -> None:
        """Free the gathered parameters: only the shard stays."""
        ### BEGIN SOLUTION
        self.full = None
        ### END SOLUTION
        ### HINT: drop every reference to the gathered tensor.

    def reduce_scatter_grads(self, weight_grad: Tensor, bias_grad: Tensor) -> Tensor:
        """This rank's shard of the *mean* over ranks of the flat (weight, bias) gradient."""
        ### BEGIN SOLUTION
        flat = flatten_padded([weight_grad, bias_grad], self.world_size)
        mine = flat.new_empty(self.shard.numel())
        dist.reduce_scatter_tensor(mine, flat)
        return mine / self.world_size
        ### END SOLUTION
        ### HINT: the same flatten-and-pad as the parameters, then one reduce_scatter_tensor.

    def forward(self, x: Tensor) -> Tensor:
        return GatheredLinear.apply(x, self.shard, self)

    @torch.no_grad()
    def full_state_dict(self) -> dict[str, Tensor]:
        """{"weight": ..., "bias": ...}: the full parameters as new tensors (every rank must
        call it; it leaves the layer released)."""
        ### BEGIN SOLUTION
        weight, bias = self.gather_params()
        out = {"weight": weight.clone(), "bias": bias.clone()}
        self.release_params()
        return out
        ### END SOLUTION
        ### HINT: gather, copy, release.


class GatheredLinear(torch.autograd.Function):
    """y = x·Wᵀ + b for a sharded unit: gather before use, release right after, in forward and
    again in backward; backward reduce-scatters the parameter gradient into the shard's."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, shard: Tensor, unit: FSDPLinear) -> Tensor:
        ctx.unit = unit
        ### BEGIN SOLUTION
        weight, bias = unit.gather_params()
        y = x @ weight.t() + bias
        unit.release_params()
        ctx.save_for_backward(x)  # not the weight: backward gathers it again
        return y
        ### END SOLUTION
        ### HINT: save only what backward cannot get back (x); the weight is gathered again.

    @staticmethod
    def backward(ctx: Any, grad_y: Tensor) -> tuple[Tensor, Tensor, None]:
        unit = ctx.unit
        ### BEGIN SOLUTION
        (x,) = ctx.saved_tensors
        weight, bias = unit.gather_params()
        grad_x = grad_y @ weight               # (b, out) @ (out, in) -> (b, in)
        grad_weight = grad_y.t() @ x           # (out, b) @ (b, in) -> (out, in)
        grad_bias = grad_y.sum(0)
        unit.release_params()
        return grad_x, unit.reduce_scatter_grads(grad_weight, grad_bias), None
        ### END SOLUTION
        ### HINT: gather, compute the three gradients of y = x·Wᵀ + b, release, and return
        ### HINT: (grad of x, this rank's shard of the mean parameter gradient, None).
