"""Expert parallelism on real ranks, set beside the single-process layer and the byte formula.

    run = compare(d_model=16, d_ff=32, num_experts=4, top_k=2, capacity_factor=1.0,
                  tokens=[12, 7, 9, 4])                       # 4 ranks, ep = 4
    run.errors        # max |EP − one process| of y and of every gradient
    run.traffic       # per rank: recorded bytes vs toolkit.cost.experts.step_bytes
    compare(..., tokens=[8, 8, 8, 8], layout=Layout(dp=4, ep=2))   # EP × DP on a 2 × 2 grid
    compare(..., method="p2p", ranks_per_node=2, max_nodes=1)       # node-limited routing
    all_to_all_support(3)   # which all-to-all forms gloo accepts with uneven pieces

Every rank builds the same `MoELayer` (seeded), keeps its share (`ExpertParallelMoE.from_dense`
over its ep group of `Layout.groups("ep")`), routes its own tokens (the uneven `tokens[r]`),
computes its share of the loss (Σ_t w_t·y_t / T_total + α·aux / ranks), runs backward and sums
gradients (`reduce_gradients`: experts over the edp group, the rest over all). The recorder
counts forward, backward and the reduction apart. In the parent, `MoELayer(x,
group_sizes=tokens)` with the same loss is the reference; the comparison is in float64.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import pandas as pd
import torch
import torch.distributed as dist

from .. import comm
from ..cost.experts import cross_node_bytes, rows_per_expert, step_bytes
from ..expert_parallel import (
    ExpertParallelMoE, MoELayer, RouterStats, all_to_all, expert_process_groups, merge,
    reduce_gradients,
)
from ..launch import device, spawn
from ..planner.layout import Layout

__all__ = ["ALPHA", "EPComparison", "all_to_all_support", "compare"]

SENDS = ("all_to_all_single", "isend", "send")
"""Recorded calls that carry this rank's bytes out."""
ALPHA = 1e-2
"""Weight of the load-balancing loss (Switch Transformers, §2.2: α = 10⁻²)."""


@dataclass
class EPComparison:
    """What `compare` found."""

    errors: dict[str, float]
    """Largest |EP − reference| of y, the input gradient, the router's and the experts' grads
    (and the shared experts', when there are any)."""
    traffic: pd.DataFrame
    """One row per rank: rows sent and received (S_r, R_r), bytes recorded forward and backward
    beside `toolkit.cost.experts.step_bytes` (passed in, or sent with method="p2p"), and the
    formula's bytes leaving the rank per step (step_wire); with `ranks_per_node` and the p2p
    method, also the bytes sent to other nodes, recorded and by `cross_node_bytes`."""
    stats: RouterStats
    """The ranks' router statistics merged (equal to the reference's, checked)."""
    reference: RouterStats
    """The single-process layer's statistics."""
    ops: dict[str, list] = field(default_factory=dict)
    """Per rank: (phase, op, peer or group, bytes) of every recorded call."""


def _tokens(tokens: Sequence[int], d_model: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    # Drawn where the seeded generator lives (the CPU): the same numbers in every rank and in the
    # parent's reference, whatever device the ranks use; each rank moves its share to device().
    gen = torch.Generator().manual_seed(seed)
    total = sum(tokens)
    x = torch.randn(total, d_model, generator=gen, dtype=torch.float64, device=gen.device)
    w = torch.randn(total, d_model, generator=gen, dtype=torch.float64, device=gen.device)
    return x, w


def _loss(y: torch.Tensor, w: torch.Tensor, aux: torch.Tensor, total: int,
          groups: int) -> torch.Tensor:
    # This rank's share of the batch's loss: sums of shares are the whole batch's loss.
    return (y * w).sum() / total + ALPHA * aux / groups


def _rank(rank: int, world_size: int, cfg: dict, layout: Layout, tokens: list[int],
          seed: int, pad: bool, method: str) -> dict:
    groups = expert_process_groups(layout)
    dev = device()
    moe = MoELayer(**cfg, pad=pad, seed=seed, device=dev, dtype=torch.float64)
    ep = ExpertParallelMoE.from_dense(moe, group=groups["ep"], method=method)
    x_all, w_all = _tokens(tokens, cfg["d_model"], seed + 1)
    start = sum(tokens[:rank])
    x = x_all[start:start + tokens[rank]].to(dev).requires_grad_()
    w = w_all[start:start + tokens[rank]].to(dev)
    with comm.recording() as fwd:
        out = ep(x)
    with comm.recording() as bwd:
        _loss(out.y, w, out.aux_loss, sum(tokens), world_size).backward()
    with comm.recording() as red:
        reduce_gradients(ep, expert_group=groups["edp"] if layout.edp > 1 else None,
                         dense_group=groups["dp"])
    ops = [(phase, e.op, e.peer if e.peer is not None else e.group, e.nbytes)
           for phase, trace in (("forward", fwd), ("backward", bwd), ("reduce", red))
           for e in trace]
    shared = [] if ep.shared is None else [p.grad.cpu() for p in ep.shared.parameters()]
    return dict(y=out.y.detach().cpu(), x_grad=x.grad.cpu(),
                router=ep.router.weight.grad.cpu(), first=ep.experts.first,
                experts=[p.grad.cpu() for p in ep.experts.parameters()], shared=shared,
                stats=out.stats, load=out.stats.load, capacity=out.stats.capacity[0], ops=ops)


def compare(*, d_model: int, d_ff: int, num_experts: int, top_k: int,
            capacity_factor: float | None, tokens: Sequence[int], layout: Layout | None = None,
            pad: bool = False, method: str = "all_to_all_single", seed: int = 0,
            score: str = "softmax", num_shared: int = 0, ranks_per_node: int | None = None,
            max_nodes: int | None = None, timeout: float = 60) -> EPComparison:
    """Run `ExpertParallelMoE` on len(tokens) ranks (rank r routes tokens[r] tokens) under
    `layout` (default: ep over every rank), and compare with the single-process layer.
    `score`, `num_shared`: the router's scores and shared experts (`MoELayer`); the ep group's
    ranks sit in nodes of `ranks_per_node`, and `max_nodes` limits each token to that many."""
    tokens = [int(t) for t in tokens]
    p = len(tokens)
    layout = Layout(dp=p, ep=p) if layout is None else layout
    layout.check(p)
    if max_nodes is not None and ranks_per_node is None:
        raise ValueError("compare: max_nodes needs ranks_per_node (which ranks form a node)")
    if ranks_per_node is not None and layout.ep % ranks_per_node:
        raise ValueError(f"compare: ranks_per_node={ranks_per_node} must divide ep={layout.ep}")
    nodes = 1 if ranks_per_node is None else layout.ep // ranks_per_node
    cfg = dict(d_model=d_model, d_ff=d_ff, num_experts=num_experts, top_k=top_k,
               capacity_factor=capacity_factor, score=score, num_shared=num_shared,
               nodes=nodes, max_nodes=max_nodes)
    results = spawn(_rank, p, cfg, layout, tokens, seed, pad, method, echo=False,
                    timeout=timeout)

    ref = MoELayer(**cfg, pad=pad, seed=seed, dtype=torch.float64)
    x_all, w_all = _tokens(tokens, d_model, seed + 1)
    x_all.requires_grad_()
    out = ref(x_all, group_sizes=tokens)
    # The reference's aux loss is the mean over groups: the ranks' α·aux/p shares add up to it.
    ((out.y * w_all).sum() / sum(tokens) + ALPHA * out.aux_loss).backward()
    errors = {"y": (torch.cat([r["y"] for r in results]) - out.y).abs().max().item(),
              "x_grad": (torch.cat([r["x_grad"] for r in results]) - x_all.grad).abs().max().item(),
              "router_grad": max((r["router"] - ref.router.weight.grad).abs().max().item()
                                 for r in results)}
    expert_err = 0.0
    for r in results:
        n = r["experts"][0].shape[0]
        for mine, full in zip(r["experts"], ref.experts.parameters()):
            expert_err = max(expert_err, (mine - full.grad[r["first"]:r["first"] + n])
                             .abs().max().item())
    errors["expert_grad"] = expert_err
    if ref.shared is not None:
        errors["shared_grad"] = max((mine - full.grad).abs().max().item() for r in results
                                    for mine, full in zip(r["shared"], ref.shared.parameters()))
    traffic = _traffic(results, layout, d_model, pad, method)
    if ranks_per_node is not None and method == "p2p":
        traffic = traffic.join(_cross_traffic(results, layout, d_model, pad, ranks_per_node))
    return EPComparison(errors=errors, traffic=traffic,
                        stats=merge([r["stats"] for r in results]), reference=out.stats,
                        ops={rank: r["ops"] for rank, r in enumerate(results)})


def _traffic(results: list[dict], layout: Layout, d_model: int, pad: bool,
             method: str) -> pd.DataFrame:
    """Recorded bytes of each rank's token exchanges beside `step_bytes` over its ep group: what
    the rank passes in to all_to_all_single, or what its isends carry (the p2p method)."""
    kind = "wire" if method == "p2p" else "in"
    rows = []
    for group in layout.groups("ep"):
        loads = [results[r]["load"] for r in group]
        caps = [results[r]["capacity"] for r in group]
        formula = step_bytes(rows_per_expert(loads, caps, pad=pad), hidden=d_model,
                             elem_bytes=8)
        for rank, f in zip(group, formula):
            ops = results[rank]["ops"]

            def recorded(phase: str, ops: list = ops) -> int:
                # What the rank passes in (all_to_all_single) or sends (isend); receives are
                # the other side of someone's send.
                return sum(n for ph, op, _, n in ops if ph == phase and op in SENDS)

            rows.append(dict(rank=rank, send_rows=f["send_rows"], recv_rows=f["recv_rows"],
                             forward_recorded=recorded("forward"),
                             forward_formula=f[f"forward_{kind}"],
                             backward_recorded=recorded("backward"),
                             backward_formula=f[f"backward_{kind}"],
                             step_wire=f["step_wire"]))
    return pd.DataFrame(rows).sort_values("rank").set_index("rank")


def _cross_traffic(results: list[dict], layout: Layout, d_model: int, pad: bool,
                   ranks_per_node: int) -> pd.DataFrame:
    """Per rank: bytes its isends carried to ranks of other nodes of its ep group (forward and
    backward), beside `cross_node_bytes`."""
    rows = []
    for group in layout.groups("ep"):
        node = {g: i // ranks_per_node for i, g in enumerate(group)}
        loads = [results[r]["load"] for r in group]
        caps = [results[r]["capacity"] for r in group]
        formula = cross_node_bytes(rows_per_expert(loads, caps, pad=pad),
                                   ranks_per_node=ranks_per_node, hidden=d_model, elem_bytes=8)
        for rank, f in zip(group, formula):
            sent = sum(n for phase, op, peer, n in results[rank]["ops"]
                       if phase != "reduce" and op == "isend" and node[peer] != node[rank])
            rows.append(dict(rank=rank, cross_node_recorded=sent, cross_node_formula=f["step"]))
    return pd.DataFrame(rows).set_index("rank")


def _support(rank: int, world_size: int) -> dict[str, str]:
    dev = device()
    ins = [(rank + j) % 3 for j in range(world_size)]  # uneven pieces, zeros among them
    outs = [(j + rank) % 3 for j in range(world_size)]
    want = [100.0 * j + rank for j, n in enumerate(outs) for _ in range(n)]
    send = torch.cat([torch.full((n,), 100.0 * rank + j, device=dev) for j, n in enumerate(ins)])
    found = {}

    def attempt(name: str, call) -> None:
        try:
            got = call()
            found[name] = "works" if got == want else f"wrong values {got}"
        except Exception as err:  # what the backend says is the finding
            found[name] = f"fails: {str(err).splitlines()[0][:90]}"
        dist.barrier()

    def single() -> list:
        recv = send.new_empty(sum(outs))
        dist.all_to_all_single(recv, send, outs, ins)
        return recv.tolist()

    def listed() -> list:
        recv = [send.new_empty(n) for n in outs]
        dist.all_to_all(recv, list(send.split(ins)))
        return torch.cat(recv).tolist()

    def p2p() -> list:
        return all_to_all(send, ins, outs, group=dist.group.WORLD, method="p2p").tolist()

    attempt("all_to_all_single", single)
    attempt("all_to_all (list)", listed)
    attempt("isend/irecv (toolkit, method='p2p')", p2p)
    return found


def all_to_all_support(world_size: int = 3, *, timeout: float = 60) -> pd.DataFrame:
    """Which forms of all-to-all the backend runs with uneven pieces (rank r sends (r + j) mod 3
    elements to rank j, zeros included): one row per form, one column per rank."""
    results = spawn(_support, world_size, echo=False, timeout=timeout)
    return pd.DataFrame(results).T.rename(columns=lambda r: f"rank {r}")
