"""Lab 06's inputs and rank-side calls: how each check calls the student's mixed precision.

Imported by the grader, which makes every rank's tensors with `make_inputs` from a seed derived
from the grade's secret, and copied into the sandbox (as `_lab_harness`), where each rank
receives its own alone. Holds no answers: each call builds bf16 working parameters from the
grader's float64 draws, runs the student's pieces, and returns what they left (tensors
cloned); the collectives go through the grader's courier, which records them per section
(``unscale``, ``reduce``, ``step{t}``), so bytes and counts are the courier's, not the rank's.

A case is a dict: ``world_size``, ``kind`` ("masters", "scaler", "unscale", "reduce" or
"train") and ``seed``; ``shapes`` (parameter shapes); for "scaler" the rule's settings and
``flags`` (inf/NaN found per step; the state dict is saved after ``split`` of them); for
"unscale" ``scale``, ``bad`` ([rank, "inf" or "nan"], or None) and ``none`` (index of a
parameter without gradient, or None); for "train" ``d_in``, ``d_out``, ``batch`` (per rank),
``steps``, ``lr``, ``init_scale``, ``growth_interval`` and ``overflow`` ([step, rank] pairs
where that rank's loss is multiplied by inf: an overflow on one rank only).
"""

from __future__ import annotations

import torch
from torch import nn

BF16 = torch.bfloat16


def _randn(gen: torch.Generator, shape, scale: float = 1.0) -> torch.Tensor:
    # Drawn in the grader, on the generator's device (the CPU: the same numbers whatever the
    # ranks' device); the rank-side calls move a rank's inputs to call.device.
    return torch.randn(tuple(shape), generator=gen, dtype=torch.float64, device=gen.device) * scale


def make_inputs(case: dict, world_size: int) -> list[dict]:
    """Per rank, the float64 draws of one case (the grader's expected values use the same).
    Grader side only: each stream's seed is a hash of the case's seed and the stream's name
    (`autograder.seeds`), "shared" for what every rank gets, ("rank", r) for rank r's
    gradients or batches, so the values one rank receives reveal no other rank's."""
    from autograder.seeds import generator  # grader side: ranks never call make_inputs

    seed, kind = int(case.get("seed", 0)), case["kind"]
    shared = generator(seed, "shared")
    own = [generator(seed, "rank", r) for r in range(world_size)]
    if kind == "masters":
        one = {"w": [_randn(shared, s) for s in case["shapes"]],
               "new": [_randn(shared, s) for s in case["shapes"]]}
        return [one] * world_size
    if kind == "scaler":
        return [{}] * world_size
    if kind in ("unscale", "reduce"):
        big = case.get("scale", 1.0)  # gradients as a scaled backward leaves them
        return [{"g": [_randn(g, s, big) for s in case["shapes"]]} for g in own]
    d_in, d_out, batch, steps = case["d_in"], case["d_out"], case["batch"], case["steps"]
    w0, b0 = _randn(shared, (d_out, d_in), 0.5), _randn(shared, (d_out,), 0.5)
    return [{"w0": w0, "b0": b0, "x": _randn(g, (steps, batch, d_in)),
             "y": _randn(g, (steps, batch, d_out))} for g in own]


class SGD:
    """Plain SGD over the masters (p −= lr·grad), with torch.optim.SGD's `step` and
    `zero_grad(set_to_none=True)` but not its class: building a torch optimizer imports
    torch._dynamo, seconds in every freshly forked rank. The grader's float64 reference steps
    with torch.optim.SGD itself."""

    def __init__(self, params, lr: float) -> None:
        self.params, self.lr = list(params), lr

    @torch.no_grad()
    def step(self) -> None:
        for p in self.params:
            if p.grad is not None:
                p.add_(p.grad, alpha=-self.lr)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()


def _params(values: list[torch.Tensor], device: str) -> list[nn.Parameter]:
    """bf16 working parameters on the rank's device."""
    return [nn.Parameter(v.to(device=device, dtype=BF16)) for v in values]


def _clone(t):
    return t.detach().clone() if isinstance(t, torch.Tensor) else None


def _masters(student, call):
    params = _params(call.inputs["w"], call.device)
    ptrs = [p.data_ptr() for p in params]
    masters = list(student.master_copy(params))
    out = {"masters": [_clone(m) for m in masters],
           "leaf": [isinstance(m, torch.Tensor) and m.is_leaf and m.requires_grad
                    for m in masters],
           "shared": [isinstance(m, torch.Tensor) and m.untyped_storage().data_ptr()
                      == p.untyped_storage().data_ptr() for m, p in zip(masters, params)]}
    if not all(isinstance(m, torch.Tensor) and m.shape == p.shape
               for m, p in zip(masters, params)) or len(masters) != len(params):
        return out
    with torch.no_grad():
        for m, v in zip(masters, call.inputs["new"]):
            m.copy_(v.to(m.device))  # the masters after a step (the grader's values)
    student.copy_to_working(masters, params)
    return {**out, "working": [_clone(p) for p in params],
            "same_storage": [p.data_ptr() == q for p, q in zip(params, ptrs)]}


def _scaler(student, call):
    c = call.case
    rule = {k: c[k] for k in ("growth_factor", "backoff_factor", "growth_interval") if k in c}
    a = student.LossScaler(c["init_scale"], **rule)
    scaled = a.scale_loss(torch.tensor(3.0, device=call.device))
    scales = []
    flags, split = c["flags"], c["split"]
    for found in flags[:split]:
        a.update(found)
        scales.append(float(a.scale))
    state = a.state_dict()
    b = student.LossScaler(1.0)  # default rule: everything must come from the state dict
    b.load_state_dict(state)
    resumed = []
    for found in flags[split:]:
        a.update(found)
        b.update(found)
        scales.append(float(a.scale))
        resumed.append(float(b.scale))
    return {"scaled": _clone(scaled), "scales": scales, "resumed": resumed,
            "state": {k: v for k, v in state.items() if isinstance(v, (int, float, bool))}
            if isinstance(state, dict) else None}


def _grads(call) -> list[nn.Parameter]:
    """bf16 parameters holding this rank's bf16 gradients (one without, where the case says)."""
    grads = call.inputs["g"]
    params = _params([torch.zeros_like(g) for g in grads], call.device)
    for i, (p, g) in enumerate(zip(params, grads)):
        if i != call.case.get("none"):
            p.grad = g.to(device=call.device, dtype=BF16)
    return params


def _unscale(student, call):
    c = call.case
    params = _grads(call)
    bad = c.get("bad")
    if bad is not None and bad[0] == call.rank:
        params[-1].grad.view(-1)[0] = float(bad[1])  # an overflow on this rank only
    masters = [nn.Parameter(torch.zeros(p.shape, device=call.device)) for p in params]
    scaler = student.LossScaler(c["scale"])
    with call.section("unscale"):
        found = scaler.unscale_(params, masters)
    return {"found": found if isinstance(found, bool) else bool(found),
            "grads": [_clone(m.grad) for m in masters],
            "working": [_clone(p.grad) for p in params]}


def _reduce(student, call):
    bf16 = _grads(call)
    with call.section("reduce"):
        student.all_reduce_gradients(bf16)
    return {"grads": [_clone(p.grad) for p in bf16]}


def _train(student, call):
    c, i, rank = call.case, call.inputs, call.rank
    model = nn.Linear(c["d_in"], c["d_out"], device=call.device, dtype=BF16)
    with torch.no_grad():
        model.weight.copy_(i["w0"])
        model.bias.copy_(i["b0"])
    x = i["x"].to(device=call.device, dtype=BF16)
    y = i["y"].to(device=call.device, dtype=torch.float32)
    masters = list(student.master_copy(model.parameters()))
    optimizer = SGD(masters, lr=c["lr"])
    scaler = student.LossScaler(c["init_scale"], growth_interval=c["growth_interval"])
    overflow = {tuple(o) for o in c.get("overflow", [])}
    history = []
    for t in range(c["steps"]):
        def loss_fn(m, t=t):
            loss = ((m(x[t]).float() - y[t]) ** 2).mean()  # this rank's mean squared error
            return loss * float("inf") if (t, rank) in overflow else loss
        with call.section(f"step{t}"):
            stepped = student.train_step(model, masters, optimizer, scaler, loss_fn)
        history.append({"stepped": stepped if isinstance(stepped, bool) else None,
                        "scale": float(scaler.scale), "masters": [_clone(m) for m in masters],
                        "working": [_clone(p) for p in model.parameters()]})
    return {"history": history}


CALLS = {"masters": _masters, "scaler": _scaler, "unscale": _unscale, "reduce": _reduce,
         "train": _train}
