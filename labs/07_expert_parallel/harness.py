"""Lab 07's inputs and rank-side calls: how each check calls the student's capacity rule,
dispatch and combine.

Imported by the grader, which makes every rank's tensors with `make_inputs` from a seed derived
from the grade's secret, and copied into the sandbox (as `_lab_harness`), where each rank
receives its own alone. Holds no answers: the "moe" call runs the router (softmax, top-k, gates
renormalised over the k: the course's router, lesson 13) and the experts (GELU MLPs) itself,
and the student's pieces in between; the exchanges go through the grader's courier, which
records them per section (``forward``, ``backward``), so bytes and messages are the courier's.

A case is a dict: ``world_size``, ``kind`` ("capacity", "keep" or "moe") and ``seed``; for
"capacity" ``table`` ([tokens, experts, top_k, capacity_factor] rows); for "keep" ``tokens``,
``experts``, ``top_k``, ``capacity`` and ``hot`` (weight of expert 0 in the draws, to make it
overflow); for "moe" ``d``, ``f``, ``experts``, ``top_k``, ``capacity_factor`` and ``tokens``
(per rank: uneven).

Two mistakes show only on some routings, a drop order other than GShard's and a backward
all-to-all whose splits are not swapped: a case with ``layout`` builds its routing on purpose,
every value still from the seed (`layouts.py`, read by the grader only): "order" (keep: the hot
expert's drops depend on the order), "uneven" (moe: every pair of ranks exchanges pieces of
different sizes, every rank receives a number of rows other than it sends).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F


def _rand(gen: torch.Generator, shape, bound: float) -> torch.Tensor:
    # Drawn in the grader on the CPU generator: the same numbers whatever the ranks' device.
    return (2 * torch.rand(tuple(shape), generator=gen, dtype=torch.float64, device=gen.device)
            - 1) * bound


def make_inputs(case: dict, world_size: int) -> list[dict]:
    """Per rank, the draws of one case (the grader's expected values use the same). Grader side
    only: each stream's seed is a hash of the case's seed and the stream's name
    (`autograder.seeds`): the router and the "keep" draws are shared, each expert's weights
    come from the expert's own stream and each rank's tokens from its own. A "moe" rank gets
    only its own experts' weights (w1, b1, w2, b2 of experts r·E/p … (r+1)·E/p, indexed
    locally), so it cannot run another rank's experts: the tokens must travel."""
    from autograder.seeds import generator  # grader side: ranks never call make_inputs

    seed, kind = int(case.get("seed", 0)), case["kind"]
    shared = generator(seed, "shared")
    if kind == "capacity":
        return [{}] * world_size
    layout = case.get("layout")
    if layout not in (None, {"keep": "order", "moe": "uneven"}[kind]):
        raise ValueError(f"lab 07: a {kind} case's layout is None or "
                         f"{ {'keep': 'order', 'moe': 'uneven'}[kind]!r}, got {layout!r}")
    if kind == "keep" and layout == "order":
        return [{"expert": _layouts().order(case, shared)}] * world_size
    if kind == "keep":
        weights = torch.ones(case["experts"], dtype=torch.float64, device=shared.device)
        weights[0] = case["hot"]
        expert = torch.stack([torch.multinomial(weights, case["top_k"], generator=shared)
                              for _ in range(case["tokens"])])
        return [{"expert": expert}] * world_size
    d, f, e = case["d"], case["f"], case["experts"]
    router = _rand(shared, (e, d), d ** -0.5)  # nn.Linear's bound 1/√fan_in
    experts = []
    for j in range(e):
        g = generator(seed, "expert", j)
        experts.append({"w1": _rand(g, (d, f), d ** -0.5), "b1": _rand(g, (f,), d ** -0.5),
                        "w2": _rand(g, (f, d), f ** -0.5), "b2": _rand(g, (d,), f ** -0.5)})
    local = e // world_size
    own = [generator(seed, "rank", r) for r in range(world_size)]
    inputs = [{"router": router, "x": _rand(g, (t, d), 1.0), "g": _rand(g, (t, d), 1.0),
               **{n: torch.stack([w[n] for w in experts[r * local:(r + 1) * local]])
                  for n in ("w1", "b1", "w2", "b2")}}
              for r, (g, t) in enumerate(zip(own, case["tokens"]))]
    if layout == "uneven":  # the planned routing's router and tokens replace the drawn ones
        router, xs, _ = _layouts().uneven(case, world_size, shared, own)
        inputs = [{**i, "router": router, "x": x} for i, x in zip(inputs, xs)]
    return inputs


def _layouts():
    """`layouts.py` beside this file, loaded once: by the grader only (make_inputs), never in a
    rank (the sandbox holds this file alone)."""
    import sys
    from pathlib import Path

    from autograder.sandbox.rank import load_module

    name = "_autograder_lab_07_layouts"
    return sys.modules.get(name) or load_module(Path(__file__).with_name("layouts.py"), name)


def _capacity(student, call):
    return {"capacity": [student.expert_capacity(t, e, top_k=k, capacity_factor=cf)
                         for t, e, k, cf in call.case["table"]]}


def _keep(student, call):
    c = call.case
    kept = student.keep(call.inputs["expert"].to(call.device), c["experts"], c["capacity"])
    return {"kept": kept.detach().cpu().clone() if isinstance(kept, torch.Tensor) else None}


def _experts(rows, counts, w):
    """This rank's experts on their rows, `counts[i]` for local expert i (GELU MLPs; the
    rank's inputs hold its own experts only, indexed locally)."""
    out, start = [], 0
    for i, n in enumerate(counts):
        h = rows[start:start + n]
        out.append(F.gelu(h @ w["w1"][i] + w["b1"][i]) @ w["w2"][i] + w["b2"][i])
        start += n
    return torch.cat(out)


def _moe(student, call):
    c, dev = call.case, call.device
    i = {k: v.to(dev) for k, v in call.inputs.items()}
    e, k = c["experts"], c["top_k"]
    w = {n: i[n].clone().requires_grad_() for n in ("router", "w1", "b1", "w2", "b2")}
    x = i["x"].clone().requires_grad_()
    probs = torch.softmax(x @ w["router"].T, dim=-1)
    top, expert = probs.topk(k, dim=-1)
    gate = top if k == 1 else top / top.sum(-1, keepdim=True)
    capacity = student.expert_capacity(x.shape[0], e, top_k=k, capacity_factor=c["capacity_factor"])
    kept = student.keep(expert, e, capacity)
    with call.section("forward"):
        sent = student.dispatch(x, expert, kept, num_experts=e, group=dist.group.WORLD)
        out = _experts(sent.rows, sent.counts, w)
        y = student.combine(out, gate, sent)
    with call.section("backward"):
        y.backward(i["g"])
    grads = {n: (w[n].grad if w[n].grad is not None else torch.zeros_like(w[n]))
             for n in w}
    return {"y": y.detach().clone(), "x_grad": x.grad.clone() if x.grad is not None else None,
            "router_grad": grads["router"].clone(),
            "expert_grads": {n: grads[n].clone() for n in ("w1", "b1", "w2", "b2")},
            "kept": kept.detach().clone(), "counts": list(sent.counts)}


CALLS = {"capacity": _capacity, "keep": _keep, "moe": _moe}
