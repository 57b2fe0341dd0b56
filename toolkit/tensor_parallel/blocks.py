"""Megatron's parallel MLP and self-attention: one all-reduce forward and one backward each.

MLP (Shoeybi et al., 2019, section 3, figure 3a): Z = act(X A) B. Splitting A by columns makes
act(X A) = [act(X A_1), ..., act(X A_p)] with no communication (the activation is elementwise),
and that split is exactly the row split B needs: Z = Σ_i act(X A_i) B_i. So the block is
``f -> ColumnParallelLinear -> act -> RowParallelLinear -> g``.

Self-attention (figure 3b): heads are independent, so rank r computes heads
``[r·n/p, (r+1)·n/p)``: q, k and v are column-parallel (their output features are laid out head
by head, so a contiguous slice is whole heads), the output projection is row-parallel. q, k and v
read one input, so ``f`` is applied once for all three: one all-reduce in backward, not three
(Megatron gets the same from one fused QKV layer).

Per block: one all-reduce of b·s·h elements forward (``g``) and one backward (``f``; autograd
skips it when the block's input needs no gradient, e.g. raw data into the first block); a
transformer layer (attention + MLP) has 2 + 2. With ``sequence_parallel=True`` each all-reduce
becomes an all-gather and a reduce-scatter (Korthikanti et al., 2022) and the block maps
``(b, s/p, h) -> (b, s/p, h)``.

Both build from the dense modules of `toolkit.models` (`TinyGPT`'s ``MLP`` and
``CausalSelfAttention``, or a `TinyMLP` of depth 1) with ``from_dense``. Dropout is not
supported: a dropout mask in the replicated region must be the same on every rank and one in the
split region different (Megatron keeps separate RNG states for that), so ``from_dense`` refuses a
module whose dropout probability is not 0.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from .comm_ops import copy_to_tensor_parallel, gather_from_sequence_parallel
from .layers import ColumnParallelLinear, RowParallelLinear
from .sharding import _check_features, divide, group_rank_size

__all__ = ["ParallelMLP", "ParallelSelfAttention"]


def _refuse_dropout(owner: str, module: nn.Module) -> None:
    for name, m in module.named_modules():
        if isinstance(m, nn.Dropout) and m.p > 0:
            raise ValueError(f"{owner}.from_dense: {name or 'module'} has dropout p={m.p}; tensor-"
                             f"parallel blocks here have no dropout (build the dense model with "
                             f"dropout=0.0)")


class ParallelMLP(nn.Module):
    """``act(X A) B`` with A column-parallel and B row-parallel: ``(b, s, h) -> (b, s, h)``.

    Args:
        d_model, d_ff: widths h and the hidden width; ``d_ff`` must divide by the group size.
        bias: biases on both layers.
        activation: an elementwise module; None is `nn.GELU` (TinyGPT's MLP).
        group: the tensor-parallel process group; None is the whole world.
        sequence_parallel: input and output are ``(b, s/p, h)`` (Korthikanti et al., 2022).
        seed: the layers draw their full weights from ``seed`` and ``seed + 1``.
        device: where the parameters live (None: torch's default device).
    """

    def __init__(self, d_model: int, d_ff: int, *, bias: bool = True,
                 activation: nn.Module | None = None, group: Any = None,
                 sequence_parallel: bool = False, seed: int = 0,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        _check_features("ParallelMLP", d_model=d_model, d_ff=d_ff)
        # Checked here so that the error names d_ff, not up_proj's out_features.
        divide(d_ff, group_rank_size(group)[1], "ParallelMLP: d_ff")
        self.up_proj = ColumnParallelLinear(d_model, d_ff, bias, group=group, device=device,
                                            sequence_parallel=sequence_parallel, seed=seed)
        self.act = activation if activation is not None else nn.GELU()
        self.down_proj = RowParallelLinear(d_ff, d_model, bias, group=group, device=device,
                                           sequence_parallel=sequence_parallel, seed=seed + 1)

    @classmethod
    def from_dense(cls, mlp: nn.Module, *, group: Any = None, sequence_parallel: bool = False,
                   activation: nn.Module | None = None) -> "ParallelMLP":
        """This rank's shard of a dense two-layer MLP.

        Accepts a module with ``up_proj`` and ``down_proj`` Linears (TinyGPT's ``MLP``; GELU
        unless `activation` says otherwise), or ``[Linear, activation, Linear]`` as an
        `nn.Sequential` or as the ``.layers`` of a module (``TinyMLP(depth=1)``).
        """
        seq = getattr(mlp, "layers", mlp)
        if isinstance(getattr(mlp, "up_proj", None), nn.Linear) and isinstance(
                getattr(mlp, "down_proj", None), nn.Linear):
            up, down = mlp.up_proj, mlp.down_proj
            act = activation if activation is not None else nn.GELU()
        elif (isinstance(seq, nn.Sequential) and len(seq) == 3 and isinstance(seq[0], nn.Linear)
              and isinstance(seq[2], nn.Linear)):
            up, down = seq[0], seq[2]
            act = activation if activation is not None else seq[1]
        else:
            raise TypeError(
                f"ParallelMLP.from_dense expects a module with up_proj/down_proj Linears "
                f"(TinyGPT's MLP) or [Linear, activation, Linear] (TinyMLP(depth=1)), got "
                f"{type(mlp).__name__}; a deeper MLP splits into such pairs")
        _refuse_dropout("ParallelMLP", mlp)
        if down.in_features != up.out_features:
            raise ValueError(f"ParallelMLP.from_dense: up_proj has {up.out_features} outputs but "
                             f"down_proj takes {down.in_features} inputs")
        with torch.device("meta"):
            block = cls(up.in_features, up.out_features, group=group,
                        sequence_parallel=sequence_parallel)
        block.up_proj = ColumnParallelLinear.from_dense(up, group=group,
                                                        sequence_parallel=sequence_parallel)
        block.act = act
        block.down_proj = RowParallelLinear.from_dense(down, group=group,
                                                       sequence_parallel=sequence_parallel)
        return block

    def forward(self, x: Tensor) -> Tensor:
        y = self.up_proj(x)  # f, then (b, s, h) @ (h, d_ff/p) -> (b, s, d_ff/p)
        y = self.act(y)  # elementwise, so each rank's slice needs nothing from the others
        return self.down_proj(y)  # (b, s, d_ff/p) @ (d_ff/p, h) -> (b, s, h), then g


class ParallelSelfAttention(nn.Module):
    """Causal multi-head self-attention with the heads split across ranks.

    ``(b, s, h) -> (b, s, h)`` (``(b, s/p, h)`` both ways with ``sequence_parallel``). The same
    computation as TinyGPT's ``CausalSelfAttention``: q, k, v, out projections with biases,
    softmax(q kᵀ / √d) with future positions masked.

    Args:
        d_model, n_head: width h and number of heads (all ranks together); the group size must
            divide ``n_head``.
        bias: biases on the four projections.
        group: the tensor-parallel process group; None is the whole world.
        sequence_parallel: input and output are sharded along the sequence.
        seed: the projections draw their full weights from ``seed`` ... ``seed + 3``.
        device: where the parameters live (None: torch's default device).
    """

    def __init__(self, d_model: int, n_head: int, *, bias: bool = True, group: Any = None,
                 sequence_parallel: bool = False, seed: int = 0,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        _check_features("ParallelSelfAttention", d_model=d_model, n_head=n_head)
        if d_model % n_head != 0:
            raise ValueError(f"ParallelSelfAttention: d_model={d_model} is not divisible by "
                             f"n_head={n_head}")
        self.group, self.sequence_parallel = group, sequence_parallel
        _, tp = group_rank_size(group)
        self.n_head, self.head_dim = n_head, d_model // n_head
        self.n_head_per_rank = divide(n_head, tp, "ParallelSelfAttention: n_head")
        # copy_input=False: forward applies f (or the sequence all-gather) once for q, k and v.
        kw = dict(group=group, copy_input=False, sequence_parallel=sequence_parallel,
                  device=device)
        self.q_proj = ColumnParallelLinear(d_model, d_model, bias, seed=seed, **kw)
        self.k_proj = ColumnParallelLinear(d_model, d_model, bias, seed=seed + 1, **kw)
        self.v_proj = ColumnParallelLinear(d_model, d_model, bias, seed=seed + 2, **kw)
        self.out_proj = RowParallelLinear(d_model, d_model, bias, group=group, device=device,
                                          sequence_parallel=sequence_parallel, seed=seed + 3)

    @classmethod
    def from_dense(cls, attn: nn.Module, *, group: Any = None,
                   sequence_parallel: bool = False) -> "ParallelSelfAttention":
        """This rank's heads of a dense attention with ``q_proj``, ``k_proj``, ``v_proj``,
        ``out_proj`` Linears and ``n_head`` (TinyGPT's ``CausalSelfAttention``)."""
        names = ("q_proj", "k_proj", "v_proj", "out_proj")
        if not all(isinstance(getattr(attn, n, None), nn.Linear) for n in names) or not isinstance(
                getattr(attn, "n_head", None), int):
            raise TypeError(f"ParallelSelfAttention.from_dense expects q_proj, k_proj, v_proj, "
                            f"out_proj Linears and an int n_head (TinyGPT's "
                            f"CausalSelfAttention), got {type(attn).__name__}")
        _refuse_dropout("ParallelSelfAttention", attn)
        with torch.device("meta"):
            block = cls(attn.q_proj.in_features, attn.n_head, group=group,
                        sequence_parallel=sequence_parallel)
        for n in names[:3]:
            setattr(block, n, ColumnParallelLinear.from_dense(
                getattr(attn, n), group=group, copy_input=False,
                sequence_parallel=sequence_parallel))
        block.out_proj = RowParallelLinear.from_dense(attn.out_proj, group=group,
                                                      sequence_parallel=sequence_parallel)
        return block

    def forward(self, x: Tensor) -> Tensor:
        if self.sequence_parallel:
            x = gather_from_sequence_parallel(x, self.group)  # (b, s/p, h) -> (b, s, h)
        else:
            x = copy_to_tensor_parallel(x, self.group)  # f, once for q, k and v
        b, s, _ = x.shape
        nh, hd = self.n_head_per_rank, self.head_dim
        # (b, s, h) @ (h, h/p) -> (b, s, h/p) -> (b, nh/p, s, hd), one each for q, k, v
        q = self.q_proj(x).view(b, s, nh, hd).transpose(1, 2)
        k = self.k_proj(x).view(b, s, nh, hd).transpose(1, 2)
        v = self.v_proj(x).view(b, s, nh, hd).transpose(1, 2)
        # (b, nh/p, s, hd) @ (b, nh/p, hd, s) -> (b, nh/p, s, s): this rank's heads only
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        future = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        att = att.masked_fill(future, float("-inf")).softmax(dim=-1)
        y = att @ v  # (b, nh/p, s, s) @ (b, nh/p, s, hd) -> (b, nh/p, s, hd)
        y = y.transpose(1, 2).reshape(b, s, nh * hd)  # -> (b, s, h/p), heads side by side
        return self.out_proj(y)  # (b, s, h/p) @ (h/p, h) -> (b, s, h), then g
