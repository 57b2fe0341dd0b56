"""Lab 02's rank-side calls and inputs: how each check calls the student's DDP.

Copied into the sandbox next to the student's file (as `_lab_harness`) and imported by the
grader, so the models, their rank-dependent initial weights and the data come from one place.
Holds no answers.

Each rank builds its model from ``seed + rank`` (`make_model`): the replicas start *different*,
and only the broadcast in ``DDP(...)`` makes them equal. Every step is recorded on its own
(nested ``comm.recording()``): the all-reduces of the synchronised backward (start, end as seen
when ``backward()`` returned, async or not, bytes), anything sent inside ``no_sync()``, and the
moment backward computed its last gradient (a hook on the input, whose gradient needs every
layer's): an all-reduce that starts before it overlaps with backward.

A case is a dict: ``world_size``, ``seed``, ``model`` ("toy" or "mlp"), for the toy ``tied``
(a weight used by two layers), ``frozen`` (parameter names with requires_grad=False), ``side``
(a branch used in step 0 only: no gradient in later steps); ``cap`` (bucket cap in bytes),
``steps``, ``accumulate`` (micro-batches per step, all but the last inside ``no_sync()``).
For the pure call, ``sizes`` (lists of element counts) and ``caps`` (bytes).
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn

from toolkit import comm
from toolkit.models import TinyMLP

BATCH = 8   # divisible by 2 and 4 ranks, and by 2 micro-batches at 4 ranks
LR = 0.2    # plain SGD: p -= LR · grad (the grader's reference does the same in float64)
DIMS = {"toy": (7, 5, 3), "mlp": (6, 10, 3)}  # (in, hidden, out): sizes p does not divide


class Toy(nn.Module):
    """x → a → ReLU → ·scale → b → ReLU → [c, which may share b's weight] → ReLU → head,
    plus ``side(x)`` when asked: a parameter that gets no gradient in a step that skips it.
    ``scale`` is a buffer (broadcast with the parameters, never trained)."""

    def __init__(self, d_in: int, d_hid: int, d_out: int, *, tied: bool, side: bool) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(d_in, d_hid), nn.Linear(d_hid, d_hid)
        self.c = nn.Linear(d_hid, d_hid)
        if tied:
            self.c.weight = self.b.weight  # one parameter, two uses
        self.side = nn.Linear(d_in, d_out, bias=False) if side else None
        self.head = nn.Linear(d_hid, d_out)
        self.register_buffer("scale", 1 + 0.2 * torch.randn(d_hid))

    def forward(self, x: torch.Tensor, use_side: bool = False) -> torch.Tensor:
        h = F.relu(self.a(x)) * self.scale
        h = F.relu(self.c(F.relu(self.b(h))))
        out = self.head(h)
        return out + self.side(x) if use_side and self.side is not None else out


def make_model(case: dict, rank: int = 0) -> nn.Module:
    """The case's model as rank `rank` builds it (seeded by seed + rank: ranks differ)."""
    seed = 1000 * int(case.get("seed", 0)) + rank
    d_in, d_hid, d_out = DIMS[case.get("model", "toy")]
    if case.get("model") == "mlp":
        model = TinyMLP(d_in, d_hid, d_out, depth=3, seed=seed)
    else:
        torch.manual_seed(seed)
        model = Toy(d_in, d_hid, d_out, tied=case.get("tied", False), side=case.get("side", False))
    for name, p in model.named_parameters():
        if name in case.get("frozen", ()):
            p.requires_grad_(False)
    return model


def uses_side(case: dict, step: int) -> bool:
    return bool(case.get("side")) and step == 0


def make_data(case: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole batch (the same every step)."""
    g = torch.Generator().manual_seed(7 + int(case.get("seed", 0)))
    d_in, _, d_out = DIMS[case.get("model", "toy")]
    return torch.randn(BATCH, d_in, generator=g), torch.randn(BATCH, d_out, generator=g)


def micro_batches(case: dict, rank: int,
                  world_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Rank's 1/p of the batch, cut into ``accumulate`` equal micro-batches."""
    x, y = make_data(case)
    n, k = BATCH // world_size, int(case.get("accumulate", 1))
    mine = slice(rank * n, (rank + 1) * n)
    return list(zip(x[mine].chunk(k), y[mine].chunk(k)))


def make_inputs(case: dict, world_size: int) -> list:
    """Every rank's micro-batches (the grader rebuilds models from the case)."""
    if "sizes" in case:
        return [None] * world_size
    return [micro_batches(case, r, world_size) for r in range(world_size)]


def _state(model: nn.Module) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _step(ddp, case: dict, step: int, batches: list) -> dict:
    """One training step: k − 1 micro-batches inside no_sync(), the last one synchronised."""
    use = {"use_side": True} if uses_side(case, step) else {}
    k = len(batches)
    with comm.recording() as quiet:
        if k > 1:  # only the no_sync checks need no_sync() to exist
            with ddp.no_sync():
                for x, y in batches[:-1]:
                    (F.mse_loss(ddp(x, **use), y) / k).backward()
    x, y = batches[-1]
    x = x.clone().requires_grad_()  # its gradient is the last one backward computes
    marks: dict[str, float] = {}

    def input_grad_done(grad: torch.Tensor) -> None:
        marks.setdefault("graph_done", time.time())

    x.register_hook(input_grad_done)
    with comm.recording() as trace:
        loss = F.mse_loss(ddp(x, **use), y) / k
        loss.backward()
        marks["returned"] = time.time()
        ar = [[e.start, e.end, bool(e.async_op), int(e.nbytes)] for e in trace
              if e.op == "all_reduce"]
    return {"calls": dict(trace.op_counts()), "bytes": sum(e.nbytes for e in trace),
            "all_reduces": ar, "graph_done": marks.get("graph_done"),
            "returned": marks["returned"], "quiet_calls": dict(quiet.op_counts()),
            "quiet_bytes": sum(e.nbytes for e in quiet)}


def _train(student, rank, world_size, case):
    model = make_model(case, rank)
    kwargs = {"bucket_cap_mb": case["cap"] / 2**20} if "cap" in case else {}
    ddp = student.DDP(model, **kwargs)
    after_init = _state(model)
    batches = micro_batches(case, rank, world_size)
    params = [p for p in model.parameters() if p.requires_grad]
    steps = []
    for step in range(int(case.get("steps", 3))):
        for p in params:
            p.grad = None
        steps.append(_step(ddp, case, step, batches))
        with torch.no_grad():
            for p in params:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-LR)
    return {"after_init": after_init, "final": _state(model), "steps": steps}


def _buckets(student, rank, world_size, case):
    out = []
    for sizes in case["sizes"]:
        tensors = [torch.zeros(n) for n in sizes]
        for cap in case["caps"]:
            got = student.assign_buckets(tensors, cap)
            out.append({"sizes": sizes, "cap": cap,
                        "buckets": [[int(i) for i in b] for b in got]})
    return out


CALLS = {"train": _train, "buckets": _buckets}
