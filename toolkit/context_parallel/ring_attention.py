"""Ring attention: the sequence split across ranks, key/value blocks passed round a ring.

Source: Liu, Zaharia & Abbeel, 2023, "Ring Attention with Blockwise Transformers for
Near-Infinite Context" (arXiv:2310.01889), section 3; the online softmax it relies on is Milakov
& Gimelshein, 2018, "Online normalizer calculation for softmax", and the blockwise backward is
FlashAttention-2's (Dao, 2023, arXiv:2307.08691, algorithm 2).

The math. Rank r holds the queries, keys and values of its positions, Q_r, K_r, V_r. Attention
of Q_r needs every block: O_r = Σ_j softmax(Q_r K_jᵀ/√d) V_j over the whole row. The ring makes
p steps; at step t rank r holds block j = (r − t) mod p, sends it to rank r + 1 and receives
the next from rank r − 1 while it computes. Softmax over blocks seen one at a time is exact with
a running row maximum m and running sum ℓ (the online softmax):

    S = Q_r K_jᵀ/√d,   m' = max(m, rowmax S),   ℓ' = ℓ·e^(m − m') + rowsum e^(S − m')
    O' = O·e^(m − m') + e^(S − m') V_j,          and finally O = O'/ℓ'

Each rank sends p − 1 key/value blocks (one message of 2·b·n_head·s_r·d elements each) and in
forward never holds more than two blocks at once, so memory per rank is O(s/p) however long s
is (the scores of one block pair, s_r × s_j, are the largest temporary).

Causal masking: position i sees positions ≤ i. Rank r's queries come after every position of a
block j < r (nothing masked), meet block r on the diagonal (lower triangle) and see nothing of a
block j > r (the step is skipped, but the block is still passed on). So with contiguous shards
rank p − 1 does p blocks of work and rank 0 one: the load imbalance that striped / zig-zag
layouts remove (Brandon et al., 2023, "Striped Attention").

Backward (`RingAttention.backward`): with the log-sum-exp L = m + log ℓ saved from forward, each
block's probabilities are P = e^(S − L) again, and with D = rowsum(dO ∘ O):
dV_j += Pᵀ dO, dS = P ∘ (dO V_jᵀ − D), dQ_r += dS K_j/√d, dK_j += dSᵀ Q_r/√d. dK_j and dV_j
belong to block j's owner, so they travel round the ring with the block: p − 1 key/value sends
and p gradient sends per rank (the last one brings each block's gradient home).

Shapes: ``(b, n_head, s_r, d)`` for q, k, v and the output, as `toolkit.models` lays them out
after splitting heads. Uneven shards (p does not divide s) work when ``seq_len`` is given: rank
r holds `sequence_sizes` (seq_len, p)[r] positions, the ``torch.tensor_split`` rule.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from ..arguments import check_int
from ..chunks import chunk_sizes  # the torch.tensor_split rule, shared with every split

__all__ = ["RingAttention", "full_attention", "ring_attention", "sequence_sizes", "shard_sequence"]


def sequence_sizes(seq_len: int, p: int) -> list[int]:
    """Positions each of p ranks holds: ``torch.tensor_split``'s rule, larger shards first."""
    check_int("sequence_sizes", "seq_len", seq_len, low=p,
              hint=f"at least one position for each of the p={p} context-parallel ranks")
    return chunk_sizes(seq_len, p)


def shard_sequence(x: Tensor, rank: int, p: int, *, dim: int = 2) -> Tensor:
    """Rank `rank`'s contiguous share of `x` along `dim` (2 for ``(b, n_head, s, d)``)."""
    sizes = sequence_sizes(x.shape[dim], p)
    return x.narrow(dim, sum(sizes[:rank]), sizes[rank]).contiguous()


def full_attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = True) -> Tensor:
    """softmax(q kᵀ/√d) v on one process: the reference. ``(b, nh, s, d)`` in and out."""
    att = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (b, nh, s, s)
    if causal:
        s_q, s_k = q.shape[-2], k.shape[-2]
        future = torch.ones(s_q, s_k, dtype=torch.bool, device=att.device).triu(1)
        att = att.masked_fill(future, float("-inf"))
    return att.softmax(dim=-1) @ v


def _group_info(group: Any) -> tuple[int, int, list[int]]:
    """(rank in group, group size, global rank of each group member); (0, 1, [0]) without dist."""
    if not (dist.is_available() and dist.is_initialized()):
        if group is not None:
            raise RuntimeError("a context-parallel group was given but torch.distributed is not "
                               "initialised: start the ranks with toolkit.launch.spawn")
        return 0, 1, [0]
    ranks = list(range(dist.get_world_size())) if group is None else \
        dist.get_process_group_ranks(group)
    return dist.get_rank(group), len(ranks), ranks


def _check_qkv(owner: str, q: Tensor, k: Tensor, v: Tensor) -> None:
    if q.dim() != 4 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"{owner}: q, k, v must have one shape (b, n_head, s_local, head_dim), "
                         f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")


def _local_sizes(owner: str, s_local: int, seq_len: int | None, rank: int, p: int) -> list[int]:
    """Every rank's shard length; checks that this rank holds the share the rule gives it."""
    sizes = [s_local] * p if seq_len is None else sequence_sizes(seq_len, p)
    if sizes[rank] != s_local:
        raise ValueError(f"{owner}: rank {rank} holds {s_local} positions but seq_len={seq_len} "
                         f"over p={p} ranks gives it {sizes[rank]} (shards follow "
                         f"torch.tensor_split: {sizes}); use shard_sequence")
    return sizes


def _causal_mask(q_start: int, s_q: int, k_start: int, s_k: int, *,
                 device: torch.device) -> Tensor | None:
    """True where key position > query position; None when nothing in the block is masked."""
    if k_start + s_k - 1 <= q_start:
        return None
    qpos = torch.arange(q_start, q_start + s_q, device=device)[:, None]
    kpos = torch.arange(k_start, k_start + s_k, device=device)[None, :]
    return kpos > qpos  # (s_q, s_k)


class _Ring:
    """One rank's view of the ring: neighbours, and a send/receive pair posted together."""

    def __init__(self, group: Any, rank: int, p: int, ranks: list[int]) -> None:
        self.group, self.rank, self.p = group, rank, p
        self.right, self.left = ranks[(rank + 1) % p], ranks[(rank - 1) % p]

    def shift(self, block: Tensor, into: Tensor) -> list:
        """Post: send `block` right, receive into `into` from the left (isend before irecv is
        safe: neither blocks, so no cycle of waits). Returns the handles to wait on."""
        return [dist.isend(block, dst=self.right, group=self.group),
                dist.irecv(into, src=self.left, group=self.group)]


def _wait(works: list) -> None:
    for w in works:
        w.wait()


class RingAttention(torch.autograd.Function):
    """Ring attention forward (online softmax) and backward (gradients travel with the blocks).

    ``apply(q, k, v, causal, seq_len, group)``; see the module docstring for the math and the
    messages. Computes in float32 and returns the input dtype.
    """

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, causal: bool, seq_len: int | None,
                group: Any) -> Tensor:
        rank, p, ranks = _group_info(group)
        sizes = _local_sizes("ring_attention", q.shape[2], seq_len, rank, p)
        starts = [sum(sizes[:j]) for j in range(p)]
        ring = _Ring(group, rank, p, ranks)
        dtype, scale = q.dtype, 1.0 / math.sqrt(q.shape[-1])
        qf = q.float()
        b, nh, s_r, d = q.shape
        out = torch.zeros(b, nh, s_r, d, device=q.device)
        m = torch.full((b, nh, s_r), float("-inf"), device=q.device)  # running row max
        ell = torch.zeros(b, nh, s_r, device=q.device)  # running row sum of e^(S - m)
        kv = torch.stack([k.float(), v.float()]).contiguous()  # (2, b, nh, s_j, d): one message
        for t in range(p):
            j = (rank - t) % p  # the block held at step t
            works, nxt = [], None
            if t < p - 1:  # post the next block's transfer first: it overlaps the compute below
                nxt = kv.new_empty(2, b, nh, sizes[(rank - t - 1) % p], d)
                works = ring.shift(kv, nxt)
            if not (causal and j > rank):  # j > rank: every key is in the future, skip
                s = (qf @ kv[0].transpose(-2, -1)) * scale  # (b, nh, s_r, s_j)
                mask = (_causal_mask(starts[rank], s_r, starts[j], sizes[j], device=q.device)
                        if causal else None)
                if mask is not None:
                    s = s.masked_fill(mask, float("-inf"))
                # Step 0 is the diagonal block, where every query sees itself: m is finite
                # from then on, so e^(m - m') never meets -inf - (-inf).
                m_new = torch.maximum(m, s.amax(dim=-1))
                alpha = torch.exp(m - m_new)  # rescales what was summed under the old max
                pexp = torch.exp(s - m_new[..., None])
                ell = ell * alpha + pexp.sum(dim=-1)
                out = out * alpha[..., None] + pexp @ kv[1]  # (b, nh, s_r, s_j) @ (.., s_j, d)
                m = m_new
            _wait(works)
            if nxt is not None:
                kv = nxt
        out = out / ell[..., None]
        lse = m + torch.log(ell)  # log Σ e^S per row: all backward needs of the softmax
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.info = (causal, sizes, starts, group, rank, p, ranks)
        return out.to(dtype)

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple:
        q, k, v, out, lse = ctx.saved_tensors
        causal, sizes, starts, group, rank, p, ranks = ctx.info
        ring = _Ring(group, rank, p, ranks)
        scale = 1.0 / math.sqrt(q.shape[-1])
        b, nh, s_r, d = q.shape
        qf, do = q.float(), grad_out.float()
        delta = (do * out).sum(dim=-1)  # D = rowsum(dO ∘ O), (b, nh, s_r)
        dq = torch.zeros(b, nh, s_r, d, device=q.device)
        kv = torch.stack([k.float(), v.float()]).contiguous()
        dkv = torch.zeros_like(kv)  # gradient of the block held, accumulated by every rank
        for t in range(p):
            j = (rank - t) % p
            works, nxt = [], None
            if t < p - 1:
                nxt = kv.new_empty(2, b, nh, sizes[(rank - t - 1) % p], d)
                works = ring.shift(kv, nxt)
            if not (causal and j > rank):
                s = (qf @ kv[0].transpose(-2, -1)) * scale
                mask = (_causal_mask(starts[rank], s_r, starts[j], sizes[j], device=q.device)
                        if causal else None)
                if mask is not None:
                    s = s.masked_fill(mask, float("-inf"))
                prob = torch.exp(s - lse[..., None])  # the forward's softmax, recomputed
                dkv[1] += prob.transpose(-2, -1) @ do  # dV_j += Pᵀ dO
                ds = prob * (do @ kv[1].transpose(-2, -1) - delta[..., None])
                dq += (ds @ kv[0]) * scale  # dQ_r += dS K_j / √d
                dkv[0] += (ds.transpose(-2, -1) @ qf) * scale  # dK_j += dSᵀ Q_r / √d
            _wait(works)
            if p > 1:  # hand block j's gradient on; receive the next block's accumulator
                # From the left: block (rank - t - 1)'s accumulator; at t = p - 1 our own.
                dnext = kv.new_empty(2, b, nh, sizes[(rank - t - 1) % p], d)
                _wait(ring.shift(dkv, dnext))
                dkv = dnext
            if nxt is not None:
                kv = nxt
        # After p gradient hops, the accumulator held is this rank's own block's.
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None, None


def ring_attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = True,
                   seq_len: int | None = None, group: Any = None) -> Tensor:
    """Attention of this rank's queries over the whole sequence, by ring attention.

    q, k, v: ``(b, n_head, s_r, head_dim)``, this rank's positions (`shard_sequence`).
    seq_len: the whole sequence's length; None means every rank holds ``s_r`` positions.
    group: the context-parallel process group; None is the whole world.
    Returns this rank's rows of the full attention output, ``(b, n_head, s_r, head_dim)``;
    differentiable (`RingAttention`).
    """
    _check_qkv("ring_attention", q, k, v)
    return RingAttention.apply(q, k, v, causal, seq_len, group)
