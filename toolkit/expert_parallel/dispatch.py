"""Dispatch: every kept choice's token to the rank that holds its expert; combine: the experts'
outputs back to their tokens, weighted by the gates. Expert parallelism's two all-to-alls
(GShard, Lepikhin et al., 2020, §2.2 and §3.2, Figure 3; Switch Transformers, Fedus et al.,
2022, §2.2 and Figure 3).

Rank r of an ep-rank group holds experts [r·E/ep, (r+1)·E/ep). For its T tokens (T may differ
between ranks, and be 0):

1. **Send buffer**, ordered by expert: *ragged* (``pad=False``), only the kept choices, expert by
   expert and in slot order (what dropless systems such as MegaBlocks send); *padded*
   (``pad=True``), E·C rows, expert e's C slots at rows [e·C, (e+1)·C), empty slots zero (GShard
   and Switch's fixed-size buffers: the bytes and the expert FLOPs do not depend on the routing).
2. **Counts**: one all-to-all of the rows per expert (E int64 on each rank), so that every rank
   knows how many rows it gets from each rank for each of its experts.
3. **Tokens**: one all-to-all with uneven splits (`exchange.all_to_all`). Rank r receives, from
   each rank j in turn, j's rows for r's experts; `dispatch` regroups them expert by expert
   (rows of expert i from ranks 0, 1, …), the order the expert bank runs them in.

`combine` undoes the regrouping, sends every row back to the rank it came from (the second
all-to-all), and adds gate × expert output into the row's token: y_t = Σ_j kept_t,j · g_t,j ·
E_e_t,j(x_t). A dropped choice adds nothing. Both exchanges are differentiable (`AllToAll`), so
backward runs them again the other way: 4 all-to-alls of tokens per layer and step
(`toolkit.cost.experts.step_bytes` counts their bytes).

With `group=None` there is one process and no exchange: the single-process layer
(`toolkit.expert_parallel.MoELayer`) runs the same two functions.

Shapes: x (T, d); Dispatched.rows (N, d), N = rows this rank's experts compute; combine → (T, d).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .exchange import AllToAll, all_to_all, group_info
from .router import Routing

__all__ = ["Dispatched", "combine", "dispatch"]


@dataclass
class Dispatched:
    """The rows this rank's experts compute, and what `combine` needs to send results back."""

    rows: Tensor
    """(N, d): rows for this rank's experts, grouped by expert (`counts[i]` for local expert i)."""
    counts: list[int]
    """Rows per local expert (from every rank together)."""
    first_expert: int
    """Global index of this rank's first expert."""
    tokens: int
    """T: tokens of this rank."""
    token: Tensor
    """(K,) int64: the token of each kept choice."""
    weight: Tensor
    """(K,): the gate of each kept choice (differentiable)."""
    position: Tensor
    """(K,) int64: the send-buffer row of each kept choice."""
    order: Tensor
    """(N,) int64: rows = received[order] (received: rank by rank)."""
    in_splits: list[int]
    """Rows sent to each rank in the dispatch (received back from it in combine)."""
    out_splits: list[int]
    """Rows received from each rank in the dispatch (sent back to it in combine)."""
    group: Any
    method: str

    @property
    def send_rows(self) -> int:
        """S: rows this rank sends in the dispatch (padding included)."""
        return sum(self.in_splits)

    @property
    def recv_rows(self) -> int:
        """R: rows this rank's experts receive (padding included)."""
        return sum(self.out_splits)


def _send_buffer(x: Tensor, routing: Routing, pad: bool) -> tuple[Tensor, ...]:
    """(buffer, rows per expert (E,), token, weight, position) of this rank's kept choices."""
    num_experts, capacity = routing.num_experts, routing.capacity
    token, choice = routing.kept.nonzero(as_tuple=True)  # kept choices, token by token
    expert, slot = routing.expert[token, choice], routing.slot[token, choice]
    weight = routing.gate[token, choice]
    if pad:  # expert e's slot s at row e·C + s; empty slots stay zero
        position = expert * capacity + slot
        buffer = x.new_zeros(num_experts * capacity, x.shape[1]).index_copy(0, position, x[token])
        per_expert = torch.full((num_experts,), capacity, dtype=torch.int64, device=x.device)
        return buffer, per_expert, token, weight, position
    # Ragged: by expert, then slot (slot < C <= T, so the key is unique).
    by_expert = torch.argsort(expert * (routing.tokens + 1) + slot)
    position = torch.empty_like(by_expert)
    position[by_expert] = torch.arange(by_expert.numel(), device=x.device)
    per_expert = torch.bincount(expert, minlength=num_experts)
    return x[token[by_expert]], per_expert, token, weight, position


def _regroup(received_counts: Tensor, device: torch.device) -> Tensor:
    """Row indices that turn rank-major rows (rank j: its rows for local experts 0, 1, …) into
    expert-major rows (expert i: from ranks 0, 1, …). `received_counts`: (p, E_local)."""
    p, local = received_counts.shape
    counts = received_counts.tolist()
    starts, offset = [[0] * local for _ in range(p)], 0
    for j in range(p):
        for i in range(local):
            starts[j][i], offset = offset, offset + counts[j][i]
    pieces = [torch.arange(starts[j][i], starts[j][i] + counts[j][i], device=device)
              for i in range(local) for j in range(p)]
    return torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.int64, device=device)


def dispatch(x: Tensor, routing: Routing, *, group: Any = None, pad: bool = False,
             method: str = "all_to_all_single") -> Dispatched:
    """Send each kept choice's token (a row of `x`, (T, d)) to its expert's rank (module
    docstring). `group`: the expert-parallel process group (None: one process); `pad`: send
    E·C rows with empty slots (True) or only the kept choices (False); `method`: how to
    exchange (`exchange.METHODS`)."""
    if x.dim() != 2 or x.shape[0] != routing.tokens:
        raise ValueError(f"dispatch: x must be (tokens, d) with the {routing.tokens} tokens "
                         f"that were routed, got shape {tuple(x.shape)}")
    me, p = group_info(group)
    num_experts = routing.num_experts
    if num_experts % p:
        raise ValueError(f"dispatch: {num_experts} experts cannot be shared by {p} ranks; the "
                         f"expert-parallel size must divide the number of experts")
    local = num_experts // p
    buffer, per_expert, token, weight, position = _send_buffer(x, routing, pad)
    received = all_to_all(per_expert, [local] * p, [local] * p, group=group, method=method)
    received = received.view(p, local)  # rows from rank j for my expert i
    in_splits = per_expert.view(p, local).sum(1).tolist()
    out_splits = received.sum(1).tolist()
    rows = AllToAll.apply(buffer, in_splits, out_splits, group, method)
    order = _regroup(received, x.device)
    return Dispatched(rows=rows[order], counts=received.sum(0).tolist(), first_expert=me * local,
                      tokens=x.shape[0], token=token, weight=weight, position=position,
                      order=order, in_splits=in_splits, out_splits=out_splits, group=group,
                      method=method)


def combine(expert_out: Tensor, dispatched: Dispatched) -> Tensor:
    """y (T, d): each kept choice's expert output, sent back to its token's rank, times its gate,
    summed per token; tokens whose every choice was dropped get zeros."""
    d = dispatched
    if expert_out.shape[0] != d.order.numel():
        raise ValueError(f"combine: expert_out must have one row per dispatched row "
                         f"({d.order.numel()}), got shape {tuple(expert_out.shape)}")
    back = torch.empty_like(d.order)
    back[d.order] = torch.arange(d.order.numel(), device=d.order.device)
    returned = AllToAll.apply(expert_out[back], d.out_splits, d.in_splits, d.group, d.method)
    picked = returned[d.position]  # (K, d): each kept choice's expert output
    weighted = picked * d.weight.unsqueeze(1).to(picked.dtype)
    return picked.new_zeros(d.tokens, picked.shape[1]).index_add(0, d.token, weighted)
