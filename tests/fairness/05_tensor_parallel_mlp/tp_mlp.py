"""An independent correct solution of lab 05, written from the student edition: shards by
`chunk` rather than index slices, `view_as` for f's identity, `F.linear` in both layers.

The student edition's text follows.
Lab 05: a tensor-parallel MLP, as in Megatron-LM.

Shoeybi et al., 2019, "Megatron-LM" (arXiv:1909.08053), section 3 and figure 3a. The MLP
Z = GELU(X·A)·B splits over p ranks with A by columns and B by rows: rank r computes
GELU(X·A_r)·B_r, a full-size partial result, and the p partial results add up to Z. Two
operators carry all the communication, each the other's mirror image:

* ``f`` before the column-parallel layer: identity forward, all-reduce backward;
* ``g`` after the row-parallel layer: all-reduce forward, identity backward.

`nn.Linear` keeps Aᵀ: its ``weight`` is (out_features, in_features) and computes
``x @ weight.T + bias``. So a split of A's *columns* (output features) is a split of ``weight``'s
*rows*, and a split of A's rows is a split of ``weight``'s columns.

Use ``dist.all_reduce`` only (no other collective; `toolkit.tensor_parallel` is off limits).
Every function runs on each of the p ranks of the default process group; sizes divide by p.
Run `autograder grade labs/05_tensor_parallel_mlp/` to check your work (README.md explains each
check); `playground.ipynb` runs your layers on real ranks next to the dense ones.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn


def shard_range(size: int) -> slice:
    """This rank's equal share of `size` items: ``slice(r·size/p, (r+1)·size/p)``.

    Raises ValueError when p does not divide `size` (Megatron requires even shards)."""
    rank, p = dist.get_rank(), dist.get_world_size()
    if size % p:
        raise ValueError(f"shard_range: size={size} is not divisible by the world size {p}")
    n = size // p
    return slice(rank * n, (rank + 1) * n)


def _own(t: Tensor) -> nn.Parameter:
    """A parameter holding a copy of `t`: the shard must not share memory with the dense layer."""
    return nn.Parameter(t.detach().clone())


# ---------------------------------------------------------------------------------------------
# 1. The two operators (Megatron's f and g)
# ---------------------------------------------------------------------------------------------

class CopyToTP(torch.autograd.Function):
    """Megatron's ``f``: forward identity, backward all-reduce (sum over ranks).

    Every rank feeds the same X into its own weight shard, so X's gradient is the sum of the
    p ranks' contributions: dL/dX = Σ_r dL/dY_r · A_rᵀ."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        return x.view_as(x)  # identity, as a new autograd node over the same data

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        total = grad.clone()
        dist.all_reduce(total)
        return total


class ReduceFromTP(torch.autograd.Function):
    """Megatron's ``g``: forward all-reduce, backward identity.

    The output is the sum of the ranks' partial results, Z = Σ_r Z_r, and dZ/dZ_r is the
    identity, so every rank's partial result gets the whole gradient, unchanged."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        total = x.detach().clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return grad


def copy_to_tp(x: Tensor) -> Tensor:
    """``f`` applied to `x` (shape unchanged)."""
    return CopyToTP.apply(x)


def reduce_from_tp(x: Tensor) -> Tensor:
    """``g`` applied to `x` (shape unchanged)."""
    return ReduceFromTP.apply(x)


# ---------------------------------------------------------------------------------------------
# 2. The two parallel linear layers
# ---------------------------------------------------------------------------------------------

class ColumnParallelLinear(nn.Module):
    """Y_r = f(X)·A_r + b_r: this rank's out_features/p output features.

    Shapes: ``(..., in) -> (..., out/p)``. ``weight``: (out/p, in), ``bias``: (out/p,) or None.
    Holds ``f`` (applied to its input in forward), so its input gets the full gradient."""

    def __init__(self, weight: Tensor, bias: Tensor | None = None) -> None:
        super().__init__()
        self.weight = _own(weight)
        self.bias = _own(bias) if bias is not None else None

    @classmethod
    def from_dense(cls, linear: nn.Linear) -> "ColumnParallelLinear":
        """This rank's shard of `linear` (the same dense layer on every rank)."""
        p, r = dist.get_world_size(), dist.get_rank()
        w = linear.weight.chunk(p, dim=0)[r]
        b = None if linear.bias is None else linear.bias.chunk(p)[r]
        return cls(w, b)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(copy_to_tp(x), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """Y = g(Σ_r X_r·A_r) + b: the input arrives split by features (X_r, in_features/p of
    them, as a column-parallel layer leaves it); the output is whole on every rank.

    Shapes: ``(..., in/p) -> (..., out)``. ``weight``: (out, in/p), ``bias``: (out,) or None,
    the whole bias on every rank. Holds ``g`` (applied before the bias is added)."""

    def __init__(self, weight: Tensor, bias: Tensor | None = None) -> None:
        super().__init__()
        self.weight = _own(weight)
        self.bias = _own(bias) if bias is not None else None

    @classmethod
    def from_dense(cls, linear: nn.Linear) -> "RowParallelLinear":
        """This rank's shard of `linear` (the same dense layer on every rank)."""
        p, r = dist.get_world_size(), dist.get_rank()
        return cls(linear.weight.chunk(p, dim=1)[r], linear.bias)

    def forward(self, x: Tensor) -> Tensor:
        out = reduce_from_tp(F.linear(x, self.weight))
        return out if self.bias is None else out + self.bias


# ---------------------------------------------------------------------------------------------
# 3. The parallel MLP
# ---------------------------------------------------------------------------------------------

class ParallelMLP(nn.Module):
    """GELU(X·A)·B with A column-parallel and B row-parallel: ``(..., h) -> (..., h)``.

    ``up_proj``: a ColumnParallelLinear (h -> d_ff/p), ``down_proj``: a RowParallelLinear
    (d_ff/p -> h). One all-reduce in forward (g) and one in backward (f), nothing else."""

    def __init__(self, up_proj: ColumnParallelLinear, down_proj: RowParallelLinear) -> None:
        super().__init__()
        self.up_proj, self.down_proj = up_proj, down_proj

    @classmethod
    def from_dense(cls, mlp: nn.Module) -> "ParallelMLP":
        """This rank's shard of a dense MLP with ``up_proj`` and ``down_proj`` Linears and an
        exact GELU between them (`toolkit.models`' TinyGPT MLP, or the harness's DenseMLP)."""
        return cls(ColumnParallelLinear.from_dense(mlp.up_proj),
                   RowParallelLinear.from_dense(mlp.down_proj))

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.gelu(self.up_proj(x)))
