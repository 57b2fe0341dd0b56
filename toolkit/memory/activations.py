"""Activation memory of one transformer layer during training.

Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models", 2022, §4
(eqs. 1-3) and §5: with s the sequence length, b the micro-batch, h the hidden size, a the
attention heads and t the tensor-parallel degree, 16-bit activations and 1-byte dropout masks,
one layer stores

    no parallelism                    s·b·h·(34 + 5·a·s/h)        bytes
    tensor parallel                   s·b·h·(10 + 24/t + 5·a·s/(h·t))
    tensor + sequence parallel        s·b·h·(34 + 5·a·s/h) / t
    full recomputation                2·s·b·h                     (only the layer's input kept)

The 34·s·b·h counts the inputs of the linear layers, GELU and layer norms and the dropout
masks; 5·a·s²·b is the attention's s×s score matrices (softmax output 2·a·s²·b, its dropout
mask a·s²·b, the dropout output 2·a·s²·b). With t-way tensor parallelism only the 24 and the
scores are split; sequence parallelism splits the remaining 10 too. The paper's whole-model
figures add the embeddings and output layer; these functions count transformer layers only.
"""

from __future__ import annotations

from ..arguments import check_int, check_ints

RECOMPUTE = ("none", "full")
"""Activation recomputation policies modelled here."""


def activation_bytes_per_layer(*, seq_len: int, batch: int, hidden: int, heads: int,
                               tensor_parallel: int = 1, sequence_parallel: bool = False,
                               recompute: str = "none") -> float:
    """Bytes of activations one transformer layer keeps for its backward (Korthikanti et al.
    2022, eqs. 1-3 and §5); see the module docstring for the four cases."""
    check_ints("activation_bytes_per_layer", seq_len=seq_len, batch=batch, hidden=hidden,
               heads=heads, tensor_parallel=tensor_parallel)
    if recompute not in RECOMPUTE:
        raise ValueError(f"activation_bytes_per_layer: recompute must be one of {RECOMPUTE}, "
                         f"got {recompute!r}")
    s, b, h, a, t = seq_len, batch, hidden, heads, tensor_parallel
    sbh = s * b * h
    if recompute == "full":
        # Only the layer's input is kept (2 bytes per element); with sequence parallelism it
        # is split along s across the t ranks (Korthikanti §5, Table 2).
        return 2 * sbh / (t if sequence_parallel else 1)
    if sequence_parallel:
        return sbh * (34 + 5 * a * s / h) / t
    return sbh * (10 + 24 / t + 5 * a * s / (h * t))


def activation_bytes(*, layers: int, seq_len: int, batch: int, hidden: int, heads: int,
                     tensor_parallel: int = 1, sequence_parallel: bool = False,
                     recompute: str = "none") -> float:
    """Bytes of activations of `layers` identical transformer layers for one micro-batch:
    ``layers × activation_bytes_per_layer(...)`` (embeddings and logits left out)."""
    check_int("activation_bytes", "layers", layers, low=0)
    return layers * activation_bytes_per_layer(
        seq_len=seq_len, batch=batch, hidden=hidden, heads=heads,
        tensor_parallel=tensor_parallel, sequence_parallel=sequence_parallel,
        recompute=recompute)


__all__ = ["RECOMPUTE", "activation_bytes", "activation_bytes_per_layer"]
