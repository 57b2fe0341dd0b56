"""Activation memory of one transformer layer during training.

Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models", 2022
(arXiv:2205.05198), Table 2 (§4.1 eq. 1, §4.2.1 eq. 2, §4.2.2, §5). With s the sequence length,
b the micro-batch, h the hidden size, a the attention heads and t the tensor-parallel degree,
16-bit activations and 1-byte dropout masks, one layer stores

    case                                  bytes per layer                   Table 2 row
    no parallelism                        s·b·h·(34 + 5·a·s/h)              eq. 1
    tensor parallel                       s·b·h·(10 + 24/t + 5·a·s/(h·t))   eq. 2
    tensor + sequence parallel            s·b·h·(34 + 5·a·s/h) / t          §4.2.2
    selective recomputation (§5)          s·b·h·(10 + 24/t)                 tensor parallel
                                          s·b·h·34/t                        + sequence parallel
    full recomputation                    2·s·b·h                           (the layer's input)

The 34·s·b·h counts the inputs of the linear layers, GELU and layer norms and the dropout
masks; 5·a·s²·b is the attention's s×s score matrices (softmax output 2·a·s²·b, its dropout
mask a·s²·b, the dropout output 2·a·s²·b). With t-way tensor parallelism only the 24 and the
scores are split; sequence parallelism splits the remaining 10 too. *Selective* recomputation
(`recompute="selective"`) keeps everything but the scores and reruns q·kᵀ, softmax, dropout and
the product with v in backward: the 5·a·s/h term drops, for 4·s·h FLOPs per token and layer.

Attention that never stores the scores (`attention="flash"`: FlashAttention, Dao et al. 2022,
and the online softmax of ring attention) drops the same 5·a·s/h term by computing the scores
in tiles and keeping only each row's log-sum-exp, a·s·b fp32 numbers (4·a·s·b bytes, a fraction
4a/(34h) of the rest: 0.09 % at a head dimension of 128, left out here as the paper leaves out
other small terms). So "flash" and "selective" store the same bytes; they differ in where the
recomputation happens (inside the attention kernel, or as a rerun of the attention block).

Context parallelism over cp ranks (ring attention, Ulysses) gives each rank s/cp of the queries,
but each of those queries still attends to all s keys: a rank stores (s/cp)·b·h·(34 …) of the
per-token terms and 5·a·(s/cp)·s·b of scores, linear in cp, not 5·a·(s/cp)²·b. With flash-style
attention (which ring attention's online softmax is) no scores are stored at all.

The paper's whole-model figures add the embeddings and output layer; these functions count
transformer layers only.
"""

from __future__ import annotations

from ..arguments import check_int, check_ints

RECOMPUTE = ("none", "selective", "full")
"""Activation recomputation policies: none, Korthikanti's selective (the attention core), full."""
ATTENTION = ("materialised", "flash")
"""How attention keeps its scores for backward: the s×s matrices, or none (FlashAttention)."""


def activation_bytes_per_layer(*, seq_len: int, batch: int, hidden: int, heads: int,
                               tensor_parallel: int = 1, sequence_parallel: bool = False,
                               context_parallel: int = 1, recompute: str = "none",
                               attention: str = "materialised") -> float:
    """Bytes of activations one transformer layer keeps for its backward, on one rank
    (Korthikanti et al. 2022, Table 2; module docstring for every case).

    `seq_len` is the whole sequence s; with `context_parallel` = cp the rank holds s/cp of its
    positions (cp must divide s), whose queries attend to all s keys. `recompute` is one of
    `RECOMPUTE`, `attention` one of `ATTENTION`.
    """
    check_ints("activation_bytes_per_layer", seq_len=seq_len, batch=batch, hidden=hidden,
               heads=heads, tensor_parallel=tensor_parallel, context_parallel=context_parallel)
    if recompute not in RECOMPUTE:
        raise ValueError(f"activation_bytes_per_layer: recompute must be one of {RECOMPUTE}, "
                         f"got {recompute!r}")
    if attention not in ATTENTION:
        raise ValueError(f"activation_bytes_per_layer: attention must be one of {ATTENTION}, "
                         f"got {attention!r}")
    if seq_len % context_parallel:
        raise ValueError(f"activation_bytes_per_layer: context_parallel={context_parallel} must "
                         f"divide seq_len={seq_len}; choose a divisor")
    s, b, h, a, t = seq_len, batch, hidden, heads, tensor_parallel
    s_rank = s // context_parallel  # positions (queries) this rank holds
    sbh = s_rank * b * h
    split = t if sequence_parallel else 1  # what splits the 10·s·b·h (and the layer input)
    if recompute == "full":
        # Only the layer's input is kept (2 bytes per element); with sequence parallelism it
        # is split along s across the t ranks (Korthikanti §5, Table 2).
        return 2 * sbh / split
    per_token = sbh * (10 / split + 24 / t)  # 34·s·b·h with t = 1
    if recompute == "selective" or attention == "flash":
        return per_token
    # Softmax output (2 bytes), its dropout mask (1) and the dropout output (2) for each of the
    # a·(s/cp)·s scores of this rank's queries against all keys, split over the t ranks by heads.
    return per_token + 5 * a * s_rank * s * b / t


def activation_bytes(*, layers: int, seq_len: int, batch: int, hidden: int, heads: int,
                     tensor_parallel: int = 1, sequence_parallel: bool = False,
                     context_parallel: int = 1, recompute: str = "none",
                     attention: str = "materialised") -> float:
    """Bytes of activations of `layers` identical transformer layers for one micro-batch:
    ``layers × activation_bytes_per_layer(...)`` (embeddings and logits left out)."""
    check_int("activation_bytes", "layers", layers, low=0)
    return layers * activation_bytes_per_layer(
        seq_len=seq_len, batch=batch, hidden=hidden, heads=heads,
        tensor_parallel=tensor_parallel, sequence_parallel=sequence_parallel,
        context_parallel=context_parallel, recompute=recompute, attention=attention)


__all__ = ["ATTENTION", "RECOMPUTE", "activation_bytes", "activation_bytes_per_layer"]
