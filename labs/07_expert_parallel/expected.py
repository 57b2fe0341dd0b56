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
import torch.nn.functional as F

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


def rows_between(r: CaseResult, ref: dict) -> dict[tuple[str, int, int], torch.Tensor]:
    """The float64 rows rank `src` must send rank `dst` (src ≠ dst) in each phase, (n, d), in
    no particular order: forward, the x rows of src's kept choices for dst's experts (dispatch)
    and the outputs of src's experts for dst's kept choices (combine); backward, the gradient
    of each expert output src's tokens got, gate·g (combine's backward), and the gradient of
    the x rows dst sent src (dispatch's backward). From the grader's inputs alone."""
    c, p = r.case, r.world_size
    local = c["experts"] // p
    experts = layer(r).experts
    w = {n: getattr(experts, n).detach() for n in ("w1", "b1", "w2", "b2")}
    out = {(ph, s, t): [] for ph in ("forward", "backward") for s in range(p) for t in range(p)
           if s != t}
    for src, (i, routing) in enumerate(zip(r.inputs, ref["routings"])):
        token, choice = routing.kept.nonzero(as_tuple=True)
        for t, j in zip(token.tolist(), choice.tolist()):
            e = int(routing.expert[t, j])
            dst = e // local
            if dst == src:  # this rank's own expert: copied, not sent
                continue
            x = i["x"][t].double().clone().requires_grad_()
            y = F.gelu(x @ w["w1"][e] + w["b1"][e]) @ w["w2"][e] + w["b2"][e]
            dy = routing.gate[t, j].detach().double() * i["g"][t].double()
            y.backward(dy)
            out[("forward", src, dst)].append(x.detach())
            out[("forward", dst, src)].append(y.detach())
            out[("backward", src, dst)].append(dy)
            out[("backward", dst, src)].append(x.grad)
    d = c["d"]
    return {k: torch.stack(v) if v else torch.zeros(0, d, dtype=torch.float64)
            for k, v in out.items()}


def same_rows(got: torch.Tensor, want: torch.Tensor) -> bool:
    """`got` holds `want`'s rows in some order, each within RTOL / ATOL (a multiset match)."""
    if got.shape != want.shape:
        return False
    free = torch.ones(len(want), dtype=torch.bool)
    for row in got:
        ok = free & ((row - want).abs() <= ATOL + RTOL * want.abs()).all(dim=1)
        if not ok.any():
            return False
        free[int(ok.nonzero()[0])] = False
    return True


def wire_bytes(r: CaseResult, routings: list) -> list[dict[str, int]]:
    """Per rank, `step_bytes` for the rows each rank keeps (ragged: kept choices only)."""
    loads = [rt.load().tolist() for rt in routings]
    rows = rows_per_expert(loads, [rt.capacity for rt in routings])
    return step_bytes(rows, hidden=r.case["d"], elem_bytes=8)


def messages(r: CaseResult, routings: list) -> list[int]:
    """Per rank, the messages it sends in one case (README: one per non-empty piece): the E/p
    counts to each other rank, then, forward and again backward (the same pieces back), one
    piece of rows for each other rank that gets some of its tokens (dispatch) and one for each
    other rank whose tokens its experts kept (combine)."""
    loads = [rt.load().tolist() for rt in routings]
    rows = rows_per_expert(loads, [rt.capacity for rt in routings])
    p = r.world_size
    local = r.case["experts"] // p

    def to(src: int, dst: int) -> int:  # rows src dispatches to dst's experts
        return sum(rows[src][dst * local:(dst + 1) * local])

    return [(p - 1) + 2 * sum((to(me, j) > 0) + (to(j, me) > 0) for j in range(p) if j != me)
            for me in range(p)]


def close(got, want) -> bool:
    return isinstance(got, torch.Tensor) and got.shape == want.shape and \
        torch.allclose(got, want, rtol=RTOL, atol=ATOL)


__all__ = ["ATOL", "RTOL", "capacities", "close", "kept", "kept_in_order", "layer",
           "messages", "reference", "rows_between", "same_rows", "wire_bytes"]
