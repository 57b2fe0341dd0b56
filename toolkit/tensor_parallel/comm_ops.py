"""The communication operators of tensor parallelism, each an autograd Function with its conjugate.

Megatron-LM (Shoeybi et al., 2019, section 3, figure 3) needs two operators around a
column-parallel then row-parallel pair of layers, conjugate to each other:

=================================  ===================  ===================  =================
class                              forward              backward             paper
=================================  ===================  ===================  =================
`CopyToTensorParallel`             identity             all-reduce           Megatron's ``f``
`ReduceFromTensorParallel`         all-reduce           identity             Megatron's ``g``
`GatherFromTensorParallel`         all-gather (h)       split (h)            Megatron-LM code
`ScatterToTensorParallel`          split (h)            all-gather (h)       Megatron-LM code
`GatherFromSequenceParallel`       all-gather (s)       reduce-scatter (s)   Korthikanti ``g``
`ReduceScatterToSequenceParallel`  reduce-scatter (s)   all-gather (s)       Korthikanti ``ḡ``
=================================  ===================  ===================  =================

(h): along the last (feature) dimension; (s): along the sequence dimension.

Why conjugate: if the forward copies a tensor to p ranks that each use it, the gradient is the
*sum* of the p uses (all-reduce); if the forward sums p partial results, each rank's partial
result gets the whole gradient (identity). Sequence parallelism (Korthikanti et al., 2022)
splits each all-reduce into its two halves, reduce-scatter + all-gather, and keeps
the activations between them sharded along the sequence: the same bytes on the wire, 1/p of the
LayerNorm/dropout activations in memory. Careful: that paper's ``g`` is not the 2019 paper's
``g``; its ``g``/``ḡ`` replace the 2019 ``f``/``g`` respectively.

Activations are batch-first, ``(b, s, h)``, as in `toolkit.models` (Megatron is sequence-first),
so the sequence dimension is 1 (`SEQ_DIM`). Every collective is a `torch.distributed` call with
``group=`` (None: the whole world), so `toolkit.comm.recording()` sees each one. With a process
group initialised they run even on one rank (then they move nothing), so a trace has the same
shape at every size; without one they are skipped (see `sharding`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from .sharding import _contiguous_copy, divide, group_rank_size

__all__ = [
    "SEQ_DIM", "CopyToTensorParallel", "GatherFromSequenceParallel", "GatherFromTensorParallel",
    "ReduceFromTensorParallel", "ReduceScatterToSequenceParallel", "ScatterToTensorParallel",
    "copy_to_tensor_parallel", "gather_from_sequence_parallel", "gather_from_tensor_parallel",
    "reduce_from_tensor_parallel", "reduce_scatter_to_sequence_parallel",
    "scatter_to_tensor_parallel",
]

SEQ_DIM = 1
"""The sequence dimension of a ``(b, s, h)`` activation."""


def _active() -> bool:
    return dist.is_available() and dist.is_initialized()


def _all_reduce(x: Tensor, group: Any) -> Tensor:
    """Sum of `x` over the group, in a new tensor (the input is left as it was)."""
    out = _contiguous_copy(x)
    if _active():
        dist.all_reduce(out, group=group)
    return out


def _split(x: Tensor, dim: int, group: Any) -> Tensor:
    """This rank's slice along `dim`, no communication."""
    rank, size = group_rank_size(group)
    step = divide(x.shape[dim], size, f"dimension {dim} of the input")
    return x.narrow(dim, rank * step, step).contiguous()


def _all_gather(x: Tensor, dim: int, group: Any) -> Tensor:
    """Every rank's `x` concatenated along `dim`, in rank order: (.., n, ..) -> (.., p·n, ..)."""
    _, size = group_rank_size(group)
    if not _active():
        return _contiguous_copy(x)
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(parts, x, group=group)
    return torch.cat(parts, dim=dim)


def _reduce_scatter(x: Tensor, dim: int, group: Any) -> Tensor:
    """Sum over ranks of `x`, of which this rank keeps its slice along `dim`: n -> n/p."""
    rank, size = group_rank_size(group)
    divide(x.shape[dim], size, f"dimension {dim} of the input")
    if not _active():
        return _contiguous_copy(x)
    chunks = [c.contiguous() for c in x.chunk(size, dim=dim)]
    out = torch.empty_like(chunks[rank])
    dist.reduce_scatter(out, chunks, group=group)
    return out


class CopyToTensorParallel(torch.autograd.Function):
    """Megatron's ``f``: identity in forward, all-reduce of the gradient in backward.

    Sits before a column-parallel layer: the replicated input X feeds p weight shards, so
    dL/dX = Σ_i dL/dY_i · A_iᵀ, a sum over ranks. ``(b, s, h) -> (b, s, h)``, both ways.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Any) -> Tensor:
        ctx.group = group
        return x  # the same tensor: every rank already holds all of X

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return _all_reduce(grad, ctx.group), None  # (b, s, h) summed over the p ranks


class ReduceFromTensorParallel(torch.autograd.Function):
    """Megatron's ``g``: all-reduce in forward, identity in backward.

    Sits after a row-parallel layer: Y = Σ_i X_i B_i, so the partial products are summed; each
    partial product then gets the whole gradient dL/dY. ``(b, s, h) -> (b, s, h)``.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Any) -> Tensor:
        return _all_reduce(x, group)  # (b, s, h) partial sums -> (b, s, h) full sum

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad, None


class GatherFromTensorParallel(torch.autograd.Function):
    """All-gather along the last dimension in forward, keep this rank's slice in backward.

    Megatron-LM's ``gather_from_tensor_model_parallel_region``: a column-parallel layer with
    ``gather_output=True`` turns its shard ``(b, s, o/p)`` into the full ``(b, s, o)``.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Any) -> Tensor:
        ctx.group = group
        return _all_gather(x, -1, group)  # (b, s, o/p) -> (b, s, o)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        # The gathered output is replicated, so every rank holds the same full gradient.
        return _split(grad, -1, ctx.group), None  # (b, s, o) -> (b, s, o/p)


class ScatterToTensorParallel(torch.autograd.Function):
    """Keep this rank's slice of the last dimension in forward, all-gather in backward.

    Megatron-LM's ``scatter_to_tensor_model_parallel_region``: a row-parallel layer with
    ``input_is_parallel=False`` takes a replicated ``(b, s, i)`` and uses its ``(b, s, i/p)``.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Any) -> Tensor:
        ctx.group = group
        return _split(x, -1, group)  # (b, s, i) -> (b, s, i/p)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return _all_gather(grad, -1, ctx.group), None  # (b, s, i/p) -> (b, s, i)


class GatherFromSequenceParallel(torch.autograd.Function):
    """Korthikanti's ``g``: all-gather along the sequence in forward, reduce-scatter in backward.

    Replaces ``f`` before a column-parallel layer when activations are sequence-sharded:
    ``(b, s/p, h) -> (b, s, h)``; the gradient of the full sequence is summed over the ranks
    (as ``f`` would) and each keeps its own positions.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Any) -> Tensor:
        ctx.group = group
        return _all_gather(x, SEQ_DIM, group)  # (b, s/p, h) -> (b, s, h)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return _reduce_scatter(grad, SEQ_DIM, ctx.group), None  # (b, s, h) -> (b, s/p, h)


class ReduceScatterToSequenceParallel(torch.autograd.Function):
    """Korthikanti's ``ḡ``: reduce-scatter along the sequence in forward, all-gather in backward.

    Replaces ``g`` after a row-parallel layer: the partial sums ``(b, s, h)`` are summed and
    each rank keeps ``(b, s/p, h)``; backward gathers the gradient of the whole sequence.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Any) -> Tensor:
        ctx.group = group
        return _reduce_scatter(x, SEQ_DIM, group)  # (b, s, h) -> (b, s/p, h)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return _all_gather(grad, SEQ_DIM, ctx.group), None  # (b, s/p, h) -> (b, s, h)


def copy_to_tensor_parallel(x: Tensor, group: Any = None) -> Tensor:
    """Megatron's ``f`` (`CopyToTensorParallel`): identity forward, all-reduce backward."""
    return CopyToTensorParallel.apply(x, group)


def reduce_from_tensor_parallel(x: Tensor, group: Any = None) -> Tensor:
    """Megatron's ``g`` (`ReduceFromTensorParallel`): all-reduce forward, identity backward."""
    return ReduceFromTensorParallel.apply(x, group)


def gather_from_tensor_parallel(x: Tensor, group: Any = None) -> Tensor:
    """`GatherFromTensorParallel`: all-gather the last dimension forward, split backward."""
    return GatherFromTensorParallel.apply(x, group)


def scatter_to_tensor_parallel(x: Tensor, group: Any = None) -> Tensor:
    """`ScatterToTensorParallel`: split the last dimension forward, all-gather backward."""
    return ScatterToTensorParallel.apply(x, group)


def gather_from_sequence_parallel(x: Tensor, group: Any = None) -> Tensor:
    """Korthikanti's ``g`` (`GatherFromSequenceParallel`): all-gather s fwd, reduce-scatter bwd."""
    return GatherFromSequenceParallel.apply(x, group)


def reduce_scatter_to_sequence_parallel(x: Tensor, group: Any = None) -> Tensor:
    """Korthikanti's ``ḡ`` (`ReduceScatterToSequenceParallel`): reduce-scatter fwd, gather bwd."""
    return ReduceScatterToSequenceParallel.apply(x, group)
