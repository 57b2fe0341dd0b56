"""DeepSpeed-Ulysses: all-to-all from sequence-sharded to head-sharded, attention, and back.

Source: Jacobs et al., 2023, "DeepSpeed Ulysses: System Optimizations for Enabling Training of
Extreme Long Sequence Transformer Models" (arXiv:2309.14509), section 3 and figure 2.

The idea. Heads are independent, and attention needs the whole sequence of one head. So before
attention one all-to-all turns "my positions, all heads" into "all positions, my heads":

    (b, n_head, s/p, d)  --all-to-all-->  (b, n_head/p, s, d)

rank g keeps heads ``[g·n_head/p, (g+1)·n_head/p)``, computes ordinary attention on them over
the whole sequence, and a second all-to-all turns the output back into sequence shards. The
all-to-all is its own conjugate: its backward is the all-to-all the other way, so the two
`torch.autograd.Function` s here are each other's backward.

Traffic: each all-to-all moves (p − 1)/p of what a rank holds, over p − 1 peers. Per attention
layer, forward: q, k, v in (one all-to-all of 3·b·n_head·(s/p)·d elements) and the output back
(b·n_head·(s/p)·d): 4·b·s·h/p elements passed in per rank, of which (p − 1)/p leave it, so
4·b·s·h·(p − 1)/p² on the wire, which *falls* as p grows (ring attention sends
2·b·s·h·(p − 1)/p, which does not). The price: p can be at most n_head, and must divide it,
since a head cannot be split (`check_heads`).

Uneven sequences: with ``seq_len`` given, rank r holds `sequence_sizes` (seq_len, p)[r]
positions and the all-to-all uses uneven split sizes (gloo supports them).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from .ring_attention import _check_qkv, _group_info, _local_sizes, full_attention

__all__ = ["HeadToSequence", "SequenceToHead", "check_heads", "ulysses_attention"]


def check_heads(n_head: int, p: int) -> int:
    """Heads per rank, ``n_head / p``; a `ValueError` naming the limit when p cannot split them."""
    if p > n_head:
        raise ValueError(f"Ulysses: p={p} ranks exceeds n_head={n_head}: each rank computes whole "
                         f"heads, so context parallelism by all-to-all is capped at n_head "
                         f"ranks (use ring attention, or combine the two, beyond that)")
    if n_head % p:
        raise ValueError(f"Ulysses: n_head={n_head} is not divisible by p={p} ranks: each rank "
                         f"must get the same number of whole heads (n_head / p)")
    return n_head // p


def _all_to_all(send: Tensor, in_splits: list[int], out_splits: list[int], group: Any) -> Tensor:
    """One `dist.all_to_all_single` of flat tensors: piece i of `send` goes to group rank i."""
    recv = send.new_empty(sum(out_splits))
    if dist.is_available() and dist.is_initialized():
        dist.all_to_all_single(recv, send, out_splits, in_splits, group=group)
    else:
        recv.copy_(send)
    return recv


def _seq_to_head(x: Tensor, sizes: list[int], rank: int, p: int, group: Any) -> Tensor:
    """``(B, n_head, s_r, d) -> (B, n_head/p, s, d)``: send head group g to rank g."""
    big_b, nh, s_r, d = x.shape
    hp = nh // p
    # (B, nh, s_r, d) -> (B, p, nh/p, s_r, d) -> (p, B, nh/p, s_r, d): piece g is head group g
    send = x.reshape(big_b, p, hp, s_r, d).transpose(0, 1).contiguous().view(-1)
    out_splits = [big_b * hp * sizes[j] * d for j in range(p)]  # rank j's positions, my heads
    recv = _all_to_all(send, [big_b * hp * s_r * d] * p, out_splits, group)
    parts = [c.view(big_b, hp, sizes[j], d) for j, c in enumerate(recv.split(out_splits))]
    return torch.cat(parts, dim=2)  # positions in rank order: the whole sequence


def _head_to_seq(y: Tensor, sizes: list[int], rank: int, p: int, group: Any) -> Tensor:
    """``(B, n_head/p, s, d) -> (B, n_head, s_r, d)``: send rank j's positions back to rank j."""
    big_b, hp, _, d = y.shape
    send = torch.cat([c.contiguous().view(-1) for c in y.split(sizes, dim=2)])
    s_r = sizes[rank]
    recv = _all_to_all(send, [big_b * hp * n * d for n in sizes], [big_b * hp * s_r * d] * p,
                       group)
    # (p, B, nh/p, s_r, d) -> (B, p, nh/p, s_r, d) -> (B, nh, s_r, d): head groups in rank order
    return recv.view(p, big_b, hp, s_r, d).transpose(0, 1).reshape(big_b, p * hp, s_r, d)


class SequenceToHead(torch.autograd.Function):
    """All-to-all ``(B, n_head, s_r, d) -> (B, n_head/p, s, d)``; backward: `HeadToSequence`'s."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, sizes: list[int], group: Any) -> Tensor:
        rank, p, _ = _group_info(group)
        ctx.args = (sizes, rank, p, group)
        return _seq_to_head(x, sizes, rank, p, group)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple:
        return _head_to_seq(grad, *ctx.args), None, None


class HeadToSequence(torch.autograd.Function):
    """All-to-all ``(B, n_head/p, s, d) -> (B, n_head, s_r, d)``; backward: `SequenceToHead`'s."""

    @staticmethod
    def forward(ctx: Any, y: Tensor, sizes: list[int], group: Any) -> Tensor:
        rank, p, _ = _group_info(group)
        ctx.args = (sizes, rank, p, group)
        return _head_to_seq(y, sizes, rank, p, group)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple:
        return _seq_to_head(grad, *ctx.args), None, None


def ulysses_attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = True,
                      seq_len: int | None = None, group: Any = None) -> Tensor:
    """Attention of this rank's positions over the whole sequence, by Ulysses' all-to-all.

    q, k, v: ``(b, n_head, s_r, head_dim)``, this rank's positions (`shard_sequence`);
    p must divide n_head (`check_heads`). seq_len: the whole length, None when every rank holds
    ``s_r``. Returns ``(b, n_head, s_r, head_dim)``, differentiable. Two all-to-alls forward
    (q, k and v stacked into one; the output back) and two backward.
    """
    _check_qkv("ulysses_attention", q, k, v)
    rank, p, _ = _group_info(group)
    check_heads(q.shape[1], p)
    sizes = _local_sizes("ulysses_attention", q.shape[2], seq_len, rank, p)
    b = q.shape[0]
    qkv = torch.cat([q, k, v])  # (3b, nh, s_r, d): one all-to-all for the three
    qkv = SequenceToHead.apply(qkv, sizes, group)  # -> (3b, nh/p, s, d)
    qh, kh, vh = qkv.split(b)
    out = full_attention(qh, kh, vh, causal=causal)  # ordinary attention, my heads, all of s
    return HeadToSequence.apply(out, sizes, group)  # (b, nh/p, s, d) -> (b, nh, s_r, d)
