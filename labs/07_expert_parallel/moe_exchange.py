"""Lab 07: expert parallelism's capacity rule, dispatch and combine.

A mixture-of-experts layer (Shazeer et al., 2017; Switch Transformers, Fedus et al., 2022, §2;
GShard, Lepikhin et al., 2020, §2.2) sends each token to the k experts its router chose. With
expert parallelism rank r of p holds experts [r·E/p, (r+1)·E/p); a token travels to its
expert's rank and its output comes back (GShard §3.2, Figure 3; Switch §2.2, Figure 3):

    C = ⌈cf · k · T / E⌉                     slots per expert for this rank's T tokens
                                             (Switch eq. 3; cf = None: C = T, nothing dropped)
    choice (t, j) of expert e is kept  ⟺  fewer than C earlier choices of e in the order
                                             "every token's 1st choice, then every 2nd choice"
                                             (GShard, Algorithm 1)
    y_t = Σ_{j kept} g_t,j · E_{e_t,j}(x_t)  (a dropped choice adds nothing)

`dispatch` sends each kept choice's row of x to its expert's rank (first the rows per expert,
int64, so every rank knows what it will receive; then the rows, uneven pieces), `combine` sends
the expert outputs back and adds them, gated, into their tokens. Both exchanges are one
all-to-all each, written here from `dist.isend` / `dist.irecv` (the grader's courier carries
no `all_to_all_single`); backward runs each exchange the other way, with the splits swapped.

Shapes: x (T, d); expert, gate, kept (T, k); rows (N, d) grouped by local expert.
Use ``dist.isend`` / ``dist.irecv`` only (no collective; `toolkit.expert_parallel`, the course's
own answer, is off limits). Create every tensor on the device of its data.
Run `autograder grade .` in this folder to check your work (README.md explains each
check); `playground.ipynb` runs your layer on real ranks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

# ---------------------------------------------------------------------------------------------
# 1. Capacity and dropped tokens
# ---------------------------------------------------------------------------------------------


def expert_capacity(tokens: int, num_experts: int, *, top_k: int = 1,
                    capacity_factor: float | None = 1.0) -> int:
    """C = ⌈capacity_factor · top_k · tokens / num_experts⌉; None: C = tokens."""
    ### BEGIN SOLUTION
    if capacity_factor is None:
        return tokens
    # Rounded to 9 digits first: 1.1 · 10 / 11 is the 1 it means, not 1.0000000002.
    return math.ceil(round(capacity_factor * top_k * tokens / num_experts, 9))
    ### END SOLUTION
    ### HINT: math.ceil, not int() or //; round the quotient to 9 digits before the ceiling.


def keep(expert: Tensor, num_experts: int, capacity: int) -> Tensor:
    """(T, k) bool: which choices get a slot. Expert e's queue takes choices in the order
    (j, t): every token's first choice (t = 0, 1, …), then every token's second choice, …;
    a choice is kept when fewer than `capacity` earlier choices in that order went to e."""
    ### BEGIN SOLUTION
    tokens, k = expert.shape
    order = expert.t().reshape(-1)  # row j·T + t: choice j of token t
    onehot = torch.nn.functional.one_hot(order, num_experts)
    slot = ((onehot.cumsum(0) - 1) * onehot).sum(1)  # earlier choices of the same expert
    return (slot < capacity).view(k, tokens).t()
    ### END SOLUTION
    ### HINT: order the choices (j, t), count the earlier ones of the same expert (cumsum of a
    ### HINT: one-hot), keep those with slot < capacity.


# ---------------------------------------------------------------------------------------------
# 2. The exchange, from isend / irecv, and its adjoint
# ---------------------------------------------------------------------------------------------


def check_splits(send: Tensor, in_splits: list[int], out_splits: list[int], p: int) -> None:
    """Given: refuses splits that cannot be right, before anything is sent."""
    if len(in_splits) != p or len(out_splits) != p:
        raise ValueError(f"all_to_all: in_splits and out_splits need one entry per rank ({p}), "
                         f"got {len(in_splits)} and {len(out_splits)}")
    if sum(in_splits) != send.shape[0]:
        raise ValueError(f"all_to_all: in_splits {in_splits} add up to {sum(in_splits)} rows, "
                         f"but send has {send.shape[0]}. In a backward, the gradient has the "
                         f"rows that were received: send it back with the splits swapped "
                         f"(in_splits ↔ out_splits)")


def all_to_all(send: Tensor, in_splits: list[int], out_splits: list[int],
               group: Any = None) -> Tensor:
    """Rows [Σ in_splits[:j], Σ in_splits[:j+1]) of `send` to rank j of `group`; returns
    out_splits[j] rows from each rank j, in rank order (this rank's own piece copied, not
    sent). Uneven splits, zeros included; an empty piece is not sent. `group` None: the
    world (the ranks of the default group are its global ranks)."""
    me, p = dist.get_rank(group), dist.get_world_size(group)
    check_splits(send, in_splits, out_splits, p)
    ### BEGIN SOLUTION
    send = send.contiguous()
    recv = send.new_empty((sum(out_splits), *send.shape[1:]))
    sends, recvs = send.split(in_splits), recv.split(out_splits)
    peers = [dist.get_global_rank(group or dist.group.WORLD, j) for j in range(p)]
    works = []
    for j in range(p):  # every receive posted before any wait
        if j != me and out_splits[j]:
            works.append(dist.irecv(recvs[j], src=peers[j], group=group))
    for j in range(p):
        if j != me and in_splits[j]:
            works.append(dist.isend(sends[j], dst=peers[j], group=group))
    recvs[me].copy_(sends[me])
    for work in works:
        work.wait()
    return recv
    ### END SOLUTION
    ### HINT: split send and an empty recv buffer; irecv every non-empty piece from another
    ### HINT: rank, isend every non-empty piece to another rank, copy your own, then wait all.


def all_to_all_builtin(send: Tensor, in_splits: list[int], out_splits: list[int],
                       group: Any = None) -> Tensor:
    """OPTIONAL, not graded (the grader's courier carries no all_to_all_single): the same
    exchange as `all_to_all` from one ``dist.all_to_all_single`` with uneven split sizes, which
    gloo runs on CPU. The playground checks it against your `all_to_all` on real ranks; keep
    `dispatch` and `combine` on `all_to_all` for the grader."""
    check_splits(send, in_splits, out_splits, dist.get_world_size(group))
    ### BEGIN SOLUTION
    send = send.contiguous()
    recv = send.new_empty((sum(out_splits), *send.shape[1:]))
    dist.all_to_all_single(recv, send, out_splits, in_splits, group=group)
    return recv
    ### END SOLUTION
    ### HINT: an empty receive buffer of sum(out_splits) rows; mind the order of the two split
    ### HINT: lists in all_to_all_single's signature (output's first).


class Exchange(torch.autograd.Function):
    """`all_to_all` whose backward sends the gradient back the other way."""

    @staticmethod
    def forward(ctx: Any, send: Tensor, in_splits: list[int], out_splits: list[int],
                group: Any) -> Tensor:
        ### BEGIN SOLUTION
        ctx.args = (in_splits, out_splits, group)
        return all_to_all(send, in_splits, out_splits, group)
        ### END SOLUTION
        ### HINT: keep the splits and the group on ctx.

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple:
        ### BEGIN SOLUTION
        in_splits, out_splits, group = ctx.args
        return all_to_all(grad, out_splits, in_splits, group), None, None, None
        ### END SOLUTION
        ### HINT: the gradient of what was received goes back to where it came from.


# ---------------------------------------------------------------------------------------------
# 3. Dispatch and combine
# ---------------------------------------------------------------------------------------------


@dataclass
class Dispatched:
    """What `dispatch` returns: the rows for this rank's experts, and what `combine` needs."""

    rows: Tensor
    """(N, d): rows for this rank's experts, expert by expert (`counts[i]` for local expert i;
    within an expert, any order)."""
    counts: list[int]
    """Rows per local expert, from every rank together."""
    state: dict
    """Anything `combine` needs (yours to fill)."""


def dispatch(x: Tensor, expert: Tensor, kept: Tensor, *, num_experts: int,
             group: Any = None) -> Dispatched:
    """Each kept choice's row of x (T, d) to the rank of its expert. Two exchanges: the rows
    per expert (E int64 counts, a piece of E/p per rank), then the rows with uneven splits
    (differentiable: `Exchange`)."""
    ### BEGIN SOLUTION
    p = dist.get_world_size(group)
    local = num_experts // p
    token, choice = kept.nonzero(as_tuple=True)
    chosen = expert[token, choice]
    by_expert = torch.argsort(chosen, stable=True)  # send buffer ordered by expert
    per_expert = torch.bincount(chosen, minlength=num_experts)
    received = all_to_all(per_expert, [local] * p, [local] * p, group).view(p, local)
    in_splits = per_expert.view(p, local).sum(1).tolist()
    out_splits = received.sum(1).tolist()
    got = Exchange.apply(x[token[by_expert]], in_splits, out_splits, group)
    # Received rank by rank (rank j: its rows for my experts 0, 1, …): regroup by expert.
    starts = torch.cumsum(received.reshape(-1), 0) - received.reshape(-1)
    pieces = [torch.arange(int(starts[j * local + i]), int(starts[j * local + i])
                           + int(received[j, i]), device=x.device)
              for i in range(local) for j in range(p)]
    order = torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.int64, device=x.device)
    state = dict(token=token[by_expert], choice=choice[by_expert], order=order, tokens=len(x),
                 in_splits=in_splits, out_splits=out_splits, group=group)
    return Dispatched(rows=got[order], counts=received.sum(0).tolist(), state=state)
    ### END SOLUTION
    ### HINT: kept.nonzero gives the kept choices; sort them by expert; exchange the counts
    ### HINT: (int64), then the rows with Exchange; regroup what arrived rank by rank.


def combine(expert_out: Tensor, gate: Tensor, dispatched: Dispatched) -> Tensor:
    """y (T, d): every expert output back to its token's rank (`Exchange`), times its gate
    g_t,j, summed per token; a token without kept choices gets zeros."""
    ### BEGIN SOLUTION
    s = dispatched.state
    back = torch.empty_like(s["order"])
    back[s["order"]] = torch.arange(s["order"].numel(), device=expert_out.device)
    returned = Exchange.apply(expert_out[back], s["out_splits"], s["in_splits"], s["group"])
    weighted = returned * gate[s["token"], s["choice"]].unsqueeze(1).to(returned.dtype)
    return returned.new_zeros(s["tokens"], returned.shape[1]).index_add(0, s["token"], weighted)
    ### END SOLUTION
    ### HINT: undo dispatch's regrouping, Exchange back with the splits swapped, multiply each
    ### HINT: row by its gate, index_add into the tokens.
