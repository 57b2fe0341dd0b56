"""An independent correct solution of lab 07, written from the student edition (README and the
stubs' docstrings), without the given `check_splits`: the capacity by a tolerance below the
ceiling rather than rounding; `keep` with a Python counter per expert; `all_to_all` posting its
sends before its receives; dispatch with a sort on (expert, choice) keys and combine with
`scatter_add`; the rows within an expert in another order than the reference's (the last
rank's first).

Lab 07: expert parallelism's capacity rule, dispatch and combine (GShard, Lepikhin et al., 2020,
Algorithm 1 and §3.2; Switch Transformers, Fedus et al., 2022, eq. 3). Shapes: x (T, d);
expert, gate, kept (T, k); rows (N, d) grouped by local expert.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor


def expert_capacity(tokens: int, num_experts: int, *, top_k: int = 1,
                    capacity_factor: float | None = 1.0) -> int:
    if capacity_factor is None:
        return tokens
    exact = capacity_factor * top_k * tokens / num_experts
    return int(math.ceil(exact - 1e-9))  # 1.1·10/11 is 1.0000000000000002 in floats


def keep(expert: Tensor, num_experts: int, capacity: int) -> Tensor:
    tokens, k = expert.shape
    taken = [0] * num_experts
    kept = torch.zeros(tokens, k, dtype=torch.bool, device=expert.device)
    for j in range(k):            # every first choice, then every second one, …
        for t in range(tokens):
            e = int(expert[t, j])
            if taken[e] < capacity:
                kept[t, j] = True
            taken[e] += 1
    return kept


def all_to_all(send: Tensor, in_splits: list[int], out_splits: list[int],
               group: Any = None) -> Tensor:
    me, p = dist.get_rank(group), dist.get_world_size(group)
    if (len(in_splits), len(out_splits), sum(in_splits)) != (p, p, send.shape[0]):
        raise ValueError(f"all_to_all: splits {in_splits} / {out_splits} do not fit {p} ranks "
                         f"and {send.shape[0]} rows (a backward sends with the splits swapped)")
    world = group if group is not None else dist.group.WORLD
    send_at = [sum(in_splits[:j]) for j in range(p)]
    recv_at = [sum(out_splits[:j]) for j in range(p)]
    recv = torch.zeros((sum(out_splits),) + tuple(send.shape[1:]), dtype=send.dtype,
                       device=send.device)
    pending = []
    for j in range(p):
        if j != me and in_splits[j] > 0:
            piece = send[send_at[j]:send_at[j] + in_splits[j]].contiguous()
            pending.append(dist.isend(piece, dst=dist.get_global_rank(world, j), group=group))
    landing = []
    for j in range(p):
        if j != me and out_splits[j] > 0:
            buf = torch.empty((out_splits[j],) + tuple(send.shape[1:]), dtype=send.dtype,
                              device=send.device)
            pending.append(dist.irecv(buf, src=dist.get_global_rank(world, j), group=group))
            landing.append((j, buf))
    recv[recv_at[me]:recv_at[me] + out_splits[me]] = send[send_at[me]:send_at[me] + in_splits[me]]
    for w in pending:
        w.wait()
    for j, buf in landing:
        recv[recv_at[j]:recv_at[j] + out_splits[j]] = buf
    return recv


def all_to_all_builtin(send: Tensor, in_splits: list[int], out_splits: list[int],
                       group: Any = None) -> Tensor:
    out = torch.empty((sum(out_splits),) + tuple(send.shape[1:]), dtype=send.dtype,
                      device=send.device)
    dist.all_to_all_single(out, send.contiguous(), out_splits, in_splits, group=group)
    return out


class Exchange(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, send: Tensor, in_splits: list[int], out_splits: list[int],
                group: Any) -> Tensor:
        ctx.splits, ctx.group = (list(in_splits), list(out_splits)), group
        return all_to_all(send, in_splits, out_splits, group)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple:
        sent, received = ctx.splits
        return all_to_all(grad.contiguous(), received, sent, ctx.group), None, None, None


@dataclass
class Dispatched:
    rows: Tensor
    counts: list[int]
    state: dict


def dispatch(x: Tensor, expert: Tensor, kept: Tensor, *, num_experts: int,
             group: Any = None) -> Dispatched:
    p = dist.get_world_size(group)
    per_rank = num_experts // p
    tokens, k = expert.shape
    flat = kept.reshape(-1).nonzero().flatten()              # kept choices, index t·k + j
    experts = expert.reshape(-1)[flat]
    flat = flat[torch.sort(experts * (tokens * k) + flat).indices]  # by expert, then token
    experts = expert.reshape(-1)[flat]
    mine = torch.zeros(num_experts, dtype=torch.int64, device=x.device)
    mine.index_add_(0, experts, torch.ones_like(experts))
    theirs = all_to_all(mine, [per_rank] * p, [per_rank] * p, group).reshape(p, per_rank)
    send_splits = [int(v) for v in mine.reshape(p, per_rank).sum(1)]
    recv_splits = [int(v) for v in theirs.sum(1)]
    arrived = Exchange.apply(x[flat // k], send_splits, recv_splits, group)
    # arrived: rank 0's rows for my experts 0, 1, …, then rank 1's, …; regroup expert-major,
    # the last rank's rows first within an expert (any order is allowed there).
    sizes = theirs.reshape(-1)
    local = torch.arange(per_rank, device=x.device).repeat(p).repeat_interleave(sizes)
    source = torch.arange(p, device=x.device).repeat_interleave(per_rank).repeat_interleave(sizes)
    regroup = torch.sort(local * p + (p - 1 - source), stable=True).indices
    return Dispatched(rows=arrived[regroup], counts=[int(v) for v in theirs.sum(0)],
                      state={"flat": flat, "k": k, "tokens": tokens, "regroup": regroup,
                             "splits": (send_splits, recv_splits), "group": group})


def combine(expert_out: Tensor, gate: Tensor, dispatched: Dispatched) -> Tensor:
    s = dispatched.state
    unsorted = expert_out[torch.argsort(s["regroup"])]    # back to arrival order
    send_splits, recv_splits = s["splits"]
    back = Exchange.apply(unsorted, recv_splits, send_splits, s["group"])
    g = gate.reshape(-1)[s["flat"]].to(back.dtype).unsqueeze(1)
    token = (s["flat"] // s["k"]).unsqueeze(1).expand(-1, back.shape[1])
    y = torch.zeros(s["tokens"], back.shape[1], dtype=back.dtype, device=back.device)
    return y.scatter_add(0, token, back * g)
