"""Lab 05: a tensor-parallel MLP, as in Megatron-LM.

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
Run `autograder grade .` in this folder to check your work (README.md explains each
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
        ### BEGIN SOLUTION
        return x.view_as(x)
        ### END SOLUTION
        ### HINT: every rank already holds all of x: nothing to send.

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        ### BEGIN SOLUTION
        total = grad.contiguous().clone()
        dist.all_reduce(total)
        return total
        ### END SOLUTION
        ### HINT: sum the gradient over the ranks (all-reduce a copy; return it).


class ReduceFromTP(torch.autograd.Function):
    """Megatron's ``g``: forward all-reduce, backward identity.

    The output is the sum of the ranks' partial results, Z = Σ_r Z_r, and dZ/dZ_r is the
    identity, so every rank's partial result gets the whole gradient, unchanged."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        ### BEGIN SOLUTION
        total = x.contiguous().clone()  # a copy: the caller's tensor stays as it was
        dist.all_reduce(total)
        return total
        ### END SOLUTION
        ### HINT: return the sum over ranks of x, in a new tensor (leave x as it was).

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        ### BEGIN SOLUTION
        return grad
        ### END SOLUTION
        ### HINT: the gradient of a sum with respect to each of its terms.


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
        ### BEGIN SOLUTION
        mine = shard_range(linear.out_features)
        bias = None if linear.bias is None else linear.bias[mine]
        return cls(linear.weight[mine], bias)
        ### END SOLUTION
        ### HINT: which of weight's two dimensions are A's columns? And the bias: one per output.

    def forward(self, x: Tensor) -> Tensor:
        ### BEGIN SOLUTION
        return F.linear(copy_to_tp(x), self.weight, self.bias)  # (.., in) -> (.., out/p)
        ### END SOLUTION
        ### HINT: f first, then an ordinary linear with this rank's weight and bias.


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
        ### BEGIN SOLUTION
        mine = shard_range(linear.in_features)
        return cls(linear.weight[:, mine], linear.bias)
        ### END SOLUTION
        ### HINT: A's rows are the input features. The bias is not split.

    def forward(self, x: Tensor) -> Tensor:
        ### BEGIN SOLUTION
        partial = x @ self.weight.t()  # (.., in/p) @ (in/p, out) -> (.., out), this rank's part
        total = reduce_from_tp(partial)
        # After the sum, not before: added on every rank before g it would count p times.
        return total if self.bias is None else total + self.bias
        ### END SOLUTION
        ### HINT: a partial product, then g, then the bias (how many times may it be added?).


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
        ### BEGIN SOLUTION
        return cls(ColumnParallelLinear.from_dense(mlp.up_proj),
                   RowParallelLinear.from_dense(mlp.down_proj))
        ### END SOLUTION
        ### HINT: which layer splits which way?

    def forward(self, x: Tensor) -> Tensor:
        ### BEGIN SOLUTION
        hidden = F.gelu(self.up_proj(x))  # (.., h) -> (.., d_ff/p): GELU acts element by element
        return self.down_proj(hidden)     # (.., d_ff/p) -> (.., h), summed over ranks
        ### END SOLUTION
        ### HINT: up, GELU (exact, F.gelu's default), down. Where does communication happen?
