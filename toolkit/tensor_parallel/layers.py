"""Column- and row-parallel linear layers: one `nn.Linear` split across the ranks of a group.

A linear layer is Y = X A + b. `nn.Linear` stores Aᵀ as ``weight`` of shape (out, in), so:

* column-parallel (Shoeybi et al., 2019, section 3, eq. 3): A = [A_1, ..., A_p] split by columns
  (output features) is ``weight`` split by *rows*; rank i computes Y_i = X A_i + b_i, its slice
  of the output features. Forward needs no communication; backward needs
  dL/dX = Σ_i dL/dY_i A_iᵀ, an all-reduce (operator ``f`` in front of the layer).
* row-parallel: A = [A_1; ...; A_p] split by rows (input features) is ``weight`` split by
  *columns*; with X = [X_1, ..., X_p] split the same way, Y = Σ_i X_i A_i: an all-reduce in
  forward (operator ``g`` after the layer), none in backward. The bias is added once, after the
  sum (added on every rank before it, it would count p times).

Sizes must divide by the group size (Megatron requires it); otherwise a `ValueError` names the
size, the group size and the rule (see `sharding.divide`). Uneven shards are not supported.

Initialisation matches Megatron's CPU path: every rank draws the *full* dense weight from a
local generator seeded with ``seed`` (as `toolkit.models` does: uniform ±1/√in, PyTorch's
default for Linear) and keeps its slice, so the assembled layer is the same at every group size.
The draw happens on the CPU and the slice is copied onto the parameters' ``device`` (as for
`nn.Linear`, None means torch's default device, so ``with torch.device("meta")`` works), which
gives a GPU rank bitwise the CPU reference's weights. `from_dense` instead slices an existing
`nn.Linear` (its shards stay on the dense layer's device).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from .comm_ops import (
    copy_to_tensor_parallel, gather_from_sequence_parallel, gather_from_tensor_parallel,
    reduce_from_tensor_parallel, reduce_scatter_to_sequence_parallel, scatter_to_tensor_parallel,
)
from .sharding import _check_features, divide, group_rank_size

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "sync_sequence_parallel_grads"]


def _dense_init(out_features: int, in_features: int, bias: bool,
                seed: int) -> tuple[Tensor, Tensor | None]:
    """The full ``(out, in)`` weight and ``(out,)`` bias every rank draws before slicing."""
    gen = torch.Generator().manual_seed(seed)
    bound = 1.0 / math.sqrt(in_features)
    w = torch.empty(out_features, in_features).uniform_(-bound, bound, generator=gen)
    b = torch.empty(out_features).uniform_(-bound, bound, generator=gen) if bias else None
    return w, b


def _dense_linear(owner: str, linear: Any) -> nn.Linear:
    if not isinstance(linear, nn.Linear):
        raise TypeError(f"{owner}.from_dense expects an nn.Linear, got {type(linear).__name__}")
    return linear


def _param(t: Tensor, like: nn.Parameter) -> nn.Parameter:
    # A copy, not a view: the parallel layer must not share storage with the dense one, and a
    # frozen dense parameter stays frozen.
    return nn.Parameter(t.detach().clone(), requires_grad=like.requires_grad)


def _check_input(owner: str, x: Tensor, want: int, what: str) -> None:
    if x.shape[-1] != want:
        raise ValueError(f"{owner}: input has {x.shape[-1]} features in its last dimension, "
                         f"expected {what}={want} (shape {tuple(x.shape)})")


class ColumnParallelLinear(nn.Module):
    """Y_i = X A_i + b_i: this rank's ``out_features / p`` output features (Megatron's A split).

    Shapes: ``(b, s, h) -> (b, s, o/p)``, or ``(b, s, o)`` with ``gather_output=True``.

    Args:
        in_features, out_features, bias: as `nn.Linear` (the dense layer's sizes).
        group: the tensor-parallel process group; None is the whole world.
        gather_output: all-gather the output features so every rank returns all of Y.
        copy_input: apply ``f`` (or, with ``sequence_parallel``, the sequence all-gather) to the
            input. False when the caller already did, so that several column layers reading one
            input (q, k and v) share one all-reduce in backward instead of three.
        sequence_parallel: the input is sharded along the sequence, ``(b, s/p, h)``
            (Korthikanti et al., 2022); it is all-gathered instead of copied.
        seed: seed of the full weight drawn before slicing (see the module docstring).
        device: where the shard's parameters live (None: torch's default device).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 group: Any = None, gather_output: bool = False, copy_input: bool = True,
                 sequence_parallel: bool = False, seed: int = 0,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        _check_features("ColumnParallelLinear", in_features=in_features, out_features=out_features)
        if gather_output and sequence_parallel:
            raise ValueError("ColumnParallelLinear: gather_output=True and sequence_parallel=True "
                             "cannot be combined (the output would be sequence-sharded and full)")
        self.group, (self.tp_rank, self.tp_size) = group, group_rank_size(group)
        self.in_features, self.out_features = in_features, out_features
        self.out_features_per_rank = divide(out_features, self.tp_size,
                                            "ColumnParallelLinear: out_features")
        self.gather_output, self.copy_input = gather_output, copy_input
        self.sequence_parallel = sequence_parallel
        self.weight = nn.Parameter(torch.empty(self.out_features_per_rank, in_features,
                                               device=device))
        self.bias = (nn.Parameter(torch.empty(self.out_features_per_rank, device=device))
                     if bias else None)
        self.reset_parameters(seed)

    def reset_parameters(self, seed: int = 0) -> None:
        """Draw the full dense weight and bias from `seed`; keep this rank's rows."""
        if self.weight.is_meta:  # built on the meta device by from_dense: nothing to draw
            return
        w, b = _dense_init(self.out_features, self.in_features, self.bias is not None, seed)
        rows = slice(self.tp_rank * self.out_features_per_rank,
                     (self.tp_rank + 1) * self.out_features_per_rank)
        with torch.no_grad():
            self.weight.copy_(w[rows])
            if self.bias is not None:
                self.bias.copy_(b[rows])

    @classmethod
    def from_dense(cls, linear: nn.Linear, *, group: Any = None, gather_output: bool = False,
                   copy_input: bool = True, sequence_parallel: bool = False
                   ) -> "ColumnParallelLinear":
        """This rank's shard of `linear`: rows ``[r·o/p, (r+1)·o/p)`` of its weight and bias."""
        linear = _dense_linear("ColumnParallelLinear", linear)
        with torch.device("meta"):
            layer = cls(linear.in_features, linear.out_features, linear.bias is not None,
                        group=group, gather_output=gather_output, copy_input=copy_input,
                        sequence_parallel=sequence_parallel)
        rows = slice(layer.tp_rank * layer.out_features_per_rank,
                     (layer.tp_rank + 1) * layer.out_features_per_rank)
        layer.weight = _param(linear.weight[rows], linear.weight)  # (o/p, h) of (o, h)
        if linear.bias is not None:
            layer.bias = _param(linear.bias[rows], linear.bias)  # (o/p,) of (o,)
        return layer

    def forward(self, x: Tensor) -> Tensor:
        _check_input("ColumnParallelLinear", x, self.in_features, "in_features")
        if self.copy_input:
            if self.sequence_parallel:
                x = gather_from_sequence_parallel(x, self.group)  # (b, s/p, h) -> (b, s, h)
            else:
                x = copy_to_tensor_parallel(x, self.group)  # f: (b, s, h), all-reduce in bwd
        y = F.linear(x, self.weight, self.bias)  # (b, s, h) @ (h, o/p) -> (b, s, o/p)
        if self.gather_output:
            y = gather_from_tensor_parallel(y, self.group)  # (b, s, o/p) -> (b, s, o)
        return y

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features} "
                f"(this rank: {self.out_features_per_rank}), tp={self.tp_size}, "
                f"bias={self.bias is not None}, gather_output={self.gather_output}, "
                f"sequence_parallel={self.sequence_parallel}")


class RowParallelLinear(nn.Module):
    """Y = Σ_i X_i A_i + b: this rank's ``in_features / p`` input features, summed over ranks.

    Shapes: ``(b, s, i/p) -> (b, s, o)``; ``(b, s, i)`` in with ``input_is_parallel=False``;
    ``(b, s/p, o)`` out with ``sequence_parallel=True`` (reduce-scatter instead of all-reduce).

    Args:
        in_features, out_features, bias: as `nn.Linear` (the dense layer's sizes).
        group: the tensor-parallel process group; None is the whole world.
        input_is_parallel: the input is already split by features (it comes from a
            column-parallel layer, the usual case); False splits a replicated input first.
        sequence_parallel: reduce-scatter the sum along the sequence (Korthikanti's ``ḡ``).
            The bias is then added to this rank's positions only, so its gradient covers them
            only: call `sync_sequence_parallel_grads` after backward.
        seed: seed of the full weight drawn before slicing (see the module docstring).
        device: where the parameters live (None: torch's default device).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 group: Any = None, input_is_parallel: bool = True,
                 sequence_parallel: bool = False, seed: int = 0,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        _check_features("RowParallelLinear", in_features=in_features, out_features=out_features)
        if sequence_parallel and not input_is_parallel:
            raise ValueError("RowParallelLinear: sequence_parallel=True needs "
                             "input_is_parallel=True (as in Megatron-LM)")
        self.group, (self.tp_rank, self.tp_size) = group, group_rank_size(group)
        self.in_features, self.out_features = in_features, out_features
        self.in_features_per_rank = divide(in_features, self.tp_size,
                                           "RowParallelLinear: in_features")
        self.input_is_parallel, self.sequence_parallel = input_is_parallel, sequence_parallel
        self.weight = nn.Parameter(torch.empty(out_features, self.in_features_per_rank,
                                               device=device))
        # Not split: every rank holds the whole bias and adds it after the reduction.
        self.bias = nn.Parameter(torch.empty(out_features, device=device)) if bias else None
        self.reset_parameters(seed)

    def reset_parameters(self, seed: int = 0) -> None:
        """Draw the full dense weight and bias from `seed`; keep this rank's columns."""
        if self.weight.is_meta:  # built on the meta device by from_dense: nothing to draw
            return
        w, b = _dense_init(self.out_features, self.in_features, self.bias is not None, seed)
        cols = slice(self.tp_rank * self.in_features_per_rank,
                     (self.tp_rank + 1) * self.in_features_per_rank)
        with torch.no_grad():
            self.weight.copy_(w[:, cols])
            if self.bias is not None:
                self.bias.copy_(b)

    @classmethod
    def from_dense(cls, linear: nn.Linear, *, group: Any = None, input_is_parallel: bool = True,
                   sequence_parallel: bool = False) -> "RowParallelLinear":
        """This rank's shard of `linear`: columns ``[r·i/p, (r+1)·i/p)`` of its weight, the
        whole bias."""
        linear = _dense_linear("RowParallelLinear", linear)
        with torch.device("meta"):
            layer = cls(linear.in_features, linear.out_features, linear.bias is not None,
                        group=group, input_is_parallel=input_is_parallel,
                        sequence_parallel=sequence_parallel)
        cols = slice(layer.tp_rank * layer.in_features_per_rank,
                     (layer.tp_rank + 1) * layer.in_features_per_rank)
        layer.weight = _param(linear.weight[:, cols], linear.weight)  # (o, i/p) of (o, i)
        if linear.bias is not None:
            layer.bias = _param(linear.bias, linear.bias)  # (o,): replicated
        return layer

    def forward(self, x: Tensor) -> Tensor:
        if self.input_is_parallel:
            _check_input("RowParallelLinear", x, self.in_features_per_rank,
                         "in_features / tp (input_is_parallel=True)")
        else:
            _check_input("RowParallelLinear", x, self.in_features, "in_features")
            x = scatter_to_tensor_parallel(x, self.group)  # (b, s, i) -> (b, s, i/p)
        partial = F.linear(x, self.weight)  # (b, s, i/p) @ (i/p, o) -> (b, s, o), one term of Σ
        if self.sequence_parallel:
            y = reduce_scatter_to_sequence_parallel(partial, self.group)  # ḡ: -> (b, s/p, o)
        else:
            y = reduce_from_tensor_parallel(partial, self.group)  # g: Σ over ranks, (b, s, o)
        return y if self.bias is None else y + self.bias  # once, after the sum

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features} (this rank: {self.in_features_per_rank}), "
                f"out_features={self.out_features}, tp={self.tp_size}, "
                f"bias={self.bias is not None}, input_is_parallel={self.input_is_parallel}, "
                f"sequence_parallel={self.sequence_parallel}")


def sync_sequence_parallel_grads(module: nn.Module) -> int:
    """All-reduce the gradients of replicated parameters used on sequence shards; returns how many.

    With ``sequence_parallel=True`` a row-parallel bias is added to this rank's ``s/p`` positions
    only, so after backward each rank holds part of its gradient; the sum over the group is the
    dense gradient. Megatron-LM sums these (and the LayerNorm ones) before the optimizer step.
    One all-reduce per such parameter, in the layer's own group.
    """
    n = 0
    for m in module.modules():
        if (isinstance(m, RowParallelLinear) and m.sequence_parallel and m.bias is not None
                and m.bias.grad is not None):
            if dist.is_available() and dist.is_initialized():
                dist.all_reduce(m.bias.grad, group=m.group)
            n += 1
    return n
