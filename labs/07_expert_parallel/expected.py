"""Lab 07's expected values and the usual mistakes, for the judges in `checks.py`.

Everything comes from the course's one copy of each algorithm: `toolkit.cost.experts` for the
capacity C = ⌈cf·k·T/E⌉ (Switch Transformers eq. 3), the rows each rank dispatches and the bytes
per rank (`rows_per_expert`, `step_bytes`: what leaves a rank when empty pieces are not sent);
`toolkit.expert_parallel` for the slots in GShard's order (`slots`) and for the single-process
layer `MoELayer(x, group_sizes=[T_0, …])` (one group per rank, float64), whose outputs and
gradients the ranks must equal within `RTOL` / `ATOL`.
"""

from __future__ import annotations

import torch

from autograder.lab import CaseResult
from toolkit.cost.experts import expert_capacity, rows_per_expert, step_bytes
from toolkit.expert_parallel import MoELayer, route, slots

RTOL, ATOL = 1e-9, 1e-12
"""Outputs and gradients in float64 against the single-process layer (summation order only)."""


def capacities(table: list) -> list[int]:
    return [expert_capacity(t, e, top_k=k, capacity_factor=cf) for t, e, k, cf in table]


def kept(expert: torch.Tensor, num_experts: int, capacity: int) -> torch.Tensor:
    """GShard's rule: slot (first choices before second ones) below the capacity."""
    return slots(expert, num_experts) < capacity


def kept_in_order(expert: torch.Tensor, num_experts: int, capacity: int, *,
                  token_major: bool = False, tokens_backwards: bool = False,
                  choices_backwards: bool = False) -> torch.Tensor:
    """The usual mistakes: the kept choices when the queue takes them in another order than
    GShard's (choice rank j, then token t): token by token (token t's 2nd choice before t+1's
    1st), tokens from the last one, later choices before first ones, or any of these together."""
    if not (token_major or tokens_backwards or choices_backwards):
        raise ValueError("kept_in_order: name the wrong order (GShard's own is `kept`)")
    n, k = expert.shape
    t = torch.arange(n).flip(0) if tokens_backwards else torch.arange(n)
    j = torch.arange(k).flip(0) if choices_backwards else torch.arange(k)
    tt, jj = torch.meshgrid(t, j, indexing="ij") if token_major else \
        reversed(torch.meshgrid(j, t, indexing="ij"))
    order = (tt * k + jj).reshape(-1)  # flat (t, j) indices, in the queue's order
    onehot = torch.nn.functional.one_hot(expert.reshape(-1)[order], num_experts)
    slot = torch.empty_like(order)
    slot[order] = ((onehot.cumsum(0) - 1) * onehot).sum(1)  # earlier choices of that expert
    return (slot < capacity).view_as(expert)


def layer(r: CaseResult) -> MoELayer:
    """The single-process layer with the case's weights (float64): the experts are the ranks'
    inputs end to end (the grader's own draws)."""
    c, i = r.case, r.inputs[0]
    moe = MoELayer(c["d"], c["f"], c["experts"], top_k=c["top_k"],
                   capacity_factor=c["capacity_factor"], dtype=torch.float64)
    with torch.no_grad():
        moe.router.weight.copy_(i["router"])
        for n in ("w1", "b1", "w2", "b2"):  # each rank was given its own experts' only
            getattr(moe.experts, n).copy_(torch.cat([j[n] for j in r.inputs]))
    return moe


def reference(r: CaseResult) -> dict:
    """y and x's gradient per rank, every parameter's gradient, routings per rank."""
    moe = layer(r)
    xs = [i["x"] for i in r.inputs]
    x = torch.cat(xs).requires_grad_()
    out = moe(x, group_sizes=[len(t) for t in xs])
    out.y.backward(torch.cat([i["g"] for i in r.inputs]))
    sizes = [len(t) for t in xs]
    routings = [route(moe.router(t), top_k=r.case["top_k"],
                      capacity_factor=r.case["capacity_factor"]) for t in xs]
    return {"y": out.y.detach().split(sizes), "x_grad": x.grad.split(sizes),
            "router_grad": moe.router.weight.grad,
            "expert_grads": {n: getattr(moe.experts, n).grad for n in ("w1", "b1", "w2", "b2")},
            "routings": routings}


def wire_bytes(r: CaseResult, routings: list) -> list[dict[str, int]]:
    """Per rank, `step_bytes` for the rows each rank keeps (ragged: kept choices only)."""
    loads = [rt.load().tolist() for rt in routings]
    rows = rows_per_expert(loads, [rt.capacity for rt in routings])
    return step_bytes(rows, hidden=r.case["d"], elem_bytes=8)


def close(got, want) -> bool:
    return isinstance(got, torch.Tensor) and got.shape == want.shape and \
        torch.allclose(got, want, rtol=RTOL, atol=ATOL)


__all__ = ["ATOL", "RTOL", "capacities", "close", "kept", "kept_in_order", "layer",
           "reference", "wire_bytes"]
