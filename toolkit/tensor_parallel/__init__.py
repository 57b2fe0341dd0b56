"""Tensor parallelism as in Megatron-LM: each layer's weights split across the ranks of a group.

Source: Shoeybi et al., 2019, "Megatron-LM: Training Multi-Billion Parameter Language Models
Using Model Parallelism" (arXiv:1909.08053), section 3 and figures 3-4; sequence parallelism from
Korthikanti et al., 2022, "Reducing Activation Recomputation in Large Transformer Models"
(arXiv:2205.05198), the sequence-parallel section.

The math. A linear layer Y = X A (X: (b·s, h)) can be split two ways over p ranks:

* by columns, A = [A_1, ..., A_p]: rank i computes Y_i = X A_i, a slice of Y's features.
  Forward: nothing to send. Backward: dL/dX = Σ_i dL/dY_i A_iᵀ, an all-reduce.
* by rows, A = [A_1; ...; A_p], with X = [X_1, ..., X_p]: Y = Σ_i X_i A_i.
  Forward: an all-reduce. Backward: each rank's dL/dX_i = dL/dY A_iᵀ, nothing to send.

An MLP act(X A) B takes A by columns and B by rows: the elementwise activation keeps the column
split, which is the row split B wants, so the only communication is ``f`` before A (identity
forward, all-reduce backward) and ``g`` after B (all-reduce forward, identity backward).
Attention splits by heads the same way (q, k, v by columns, the output projection by rows). Per
transformer layer: 2 all-reduces forward and 2 backward, each of b·s·h elements, and no other
communication; a ring all-reduce sends 2(p-1)/p of those bytes per rank. Sequence parallelism
writes each all-reduce as reduce-scatter + all-gather (same bytes) and keeps the activations in
between (LayerNorm, dropout) split along the sequence.

`nn.Linear` stores Aᵀ (``weight`` is (out, in)): a column-parallel layer keeps *rows* of
``weight``, a row-parallel layer *columns*. Sizes must divide by the group size (a clear
`ValueError` otherwise). Without an initialised process group everything runs on one rank.

=========================  =================================================================
module                     holds
=========================  =================================================================
`comm_ops`                 ``f`` (`CopyToTensorParallel`), ``g`` (`ReduceFromTensorParallel`),
                           the gather/scatter pairs, the sequence-parallel pair
`layers`                   `ColumnParallelLinear`, `RowParallelLinear` (``from_dense``),
                           `sync_sequence_parallel_grads`
`blocks`                   `ParallelMLP`, `ParallelSelfAttention` (``from_dense`` of
                           `toolkit.models`' TinyGPT blocks)
`sharding`                 `group_rank_size`, `divide`, `shard`
=========================  =================================================================

::

    import torch
    from toolkit.launch import spawn
    from toolkit.models import TinyGPT
    from toolkit.tensor_parallel import ParallelMLP

    def work(rank, world_size):
        dense = TinyGPT().blocks[0].mlp            # the same weights on every rank (seeded)
        mlp = ParallelMLP.from_dense(dense)        # this rank's d_ff / world_size hidden units
        x = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(0))
        return torch.allclose(mlp(x), dense(x), atol=1e-6)   # one all-reduce

    spawn(work, world_size=4)                      # [True, True, True, True]
"""

from .blocks import ParallelMLP, ParallelSelfAttention
from .comm_ops import (
    SEQ_DIM, CopyToTensorParallel, GatherFromSequenceParallel, GatherFromTensorParallel,
    ReduceFromTensorParallel, ReduceScatterToSequenceParallel, ScatterToTensorParallel,
    copy_to_tensor_parallel, gather_from_sequence_parallel, gather_from_tensor_parallel,
    reduce_from_tensor_parallel, reduce_scatter_to_sequence_parallel, scatter_to_tensor_parallel,
)
from .layers import ColumnParallelLinear, RowParallelLinear, sync_sequence_parallel_grads
from .sharding import divide, group_rank_size, shard

__all__ = [
    "SEQ_DIM",
    "ColumnParallelLinear",
    "CopyToTensorParallel",
    "GatherFromSequenceParallel",
    "GatherFromTensorParallel",
    "ParallelMLP",
    "ParallelSelfAttention",
    "ReduceFromTensorParallel",
    "ReduceScatterToSequenceParallel",
    "RowParallelLinear",
    "ScatterToTensorParallel",
    "copy_to_tensor_parallel",
    "divide",
    "gather_from_sequence_parallel",
    "gather_from_tensor_parallel",
    "group_rank_size",
    "reduce_from_tensor_parallel",
    "reduce_scatter_to_sequence_parallel",
    "scatter_to_tensor_parallel",
    "shard",
    "sync_sequence_parallel_grads",
]
