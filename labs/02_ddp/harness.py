"""Lab 02's inputs and rank-side calls: how each check calls the student's DDP.

Imported by the grader, which makes every rank's inputs (`make_inputs`: its model's initial
weights, drawn from its own stream ("model", rank), and its micro-batches, from the stream
"data") from a seed derived from the grade's secret, and copied into the sandbox (as
`_lab_harness`), where each rank receives its own inputs alone: the replicas start
*different*, and only the broadcast in ``DDP(...)`` makes them equal. Holds no answers. Each
rank returns its weights after ``DDP(...)``, before every step and at the end: the judges
compute the gradients each step's all-reduces must carry at the weights the step started from.

Each step is cut into sections the grader's courier records (`call.section`): ``quiet{k}``
(the micro-batches inside ``no_sync()``) and ``sync{k}`` (the synchronised forward and
backward). Every forward passes the first layer's output through `Gate` (a forward hook the
harness installs after ``DDP(...)``): identity forward; in backward it asks the courier's gate
(`call.gate()`, a blocking round trip) and returns grad · s_n, s_n ∈ [1 + 1/64, 1.5] drawn from
the grade's secret for the rank's n-th gate of the case (`autograder.sandbox.gate`). So the
first layer's weight and bias gradients cannot exist before the courier answered; the buckets
before the last one (reverse parameter order) can. An all-reduce the courier received before
the synchronised backward's gate overlapped with backward: it was posted while the first layer's
gradients were still to be computed. The judges' reference applies the same s_n per micro-batch
(``gate_key`` in the case; without it the public schedule a `Call` without a channel uses).

A case is a dict: ``world_size``, ``seed``, ``model`` ("toy" or "mlp"), for the toy ``tied``
(a weight used by two layers), ``frozen`` (parameter names with requires_grad=False), ``side``
(a branch used in step 0 only: no gradient in later steps); ``cap`` (bucket cap in bytes),
``steps``, ``accumulate`` (micro-batches per step, all but the last inside ``no_sync()``).
For the pure call, ``sizes`` (lists of element counts) and ``caps`` (bytes).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.hooks import RemovableHandle

from toolkit.models import TinyMLP

BATCH = 8   # divisible by 2 and 4 ranks, and by 2 micro-batches at 4 ranks
LR = 0.2    # plain SGD: p -= LR · grad (the grader's reference does the same in float64)
DIMS = {"toy": (7, 5, 3), "mlp": (6, 10, 3)}  # (in, hidden, out): sizes p does not divide
SLOPE = 0.1  # Toy's leaky ReLU: every layer passes some gradient back, whatever the seed


class Toy(nn.Module):
    """x → a → act → ·scale → b → act → [c, which may share b's weight] → act → head,
    plus ``side(x)`` when asked: a parameter that gets no gradient in a step that skips it.
    ``scale`` is a buffer (broadcast with the parameters, never trained). act is a leaky ReLU
    (`SLOPE`): with a plain ReLU about 1 seed in 100 left c (or b) dead on the whole batch, so
    that a, b and c got zero gradients and the grade could not see what DDP did with them."""

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
        h = F.leaky_relu(self.a(x), SLOPE) * self.scale
        h = F.leaky_relu(self.c(F.leaky_relu(self.b(h), SLOPE)), SLOPE)
        out = self.head(h)
        return out + self.side(x) if use_side and self.side is not None else out


def _stream(case: dict, *labels: str | int) -> int:
    """The seed of the case's stream named `labels` (`autograder.seeds`: a hash of the case's
    seed and the labels, so a rank that recovers its own model's seed learns no other stream).
    Grader side: the case a rank sees has no seed, and a rank only builds the architecture
    (0: its weights come from its inputs) without importing the grader's modules."""
    if "seed" not in case:
        return 0
    from autograder.seeds import stream_seed  # grader side only

    return stream_seed(int(case["seed"]), *labels)


def make_model(case: dict, rank: int = 0) -> nn.Module:
    """The case's model as rank `rank` starts it (its own stream ("model", rank): ranks
    differ), on the CPU: the grader's reference builds rank 0's; a rank builds the architecture
    and loads the weights it was sent, then moves it to its device."""
    seed = _stream(case, "model", rank)
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
    g = torch.Generator().manual_seed(_stream(case, "data"))
    d_in, _, d_out = DIMS[case.get("model", "toy")]
    return torch.randn(BATCH, d_in, generator=g), torch.randn(BATCH, d_out, generator=g)


def micro_batches(case: dict, rank: int, world_size: int,
                  on: torch.device | str = "cpu") -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Rank's 1/p of the batch, cut into ``accumulate`` equal micro-batches, on device `on`."""
    x, y = (t.to(on) for t in make_data(case))
    n, k = BATCH // world_size, int(case.get("accumulate", 1))
    mine = slice(rank * n, (rank + 1) * n)
    return list(zip(x[mine].chunk(k), y[mine].chunk(k)))


def make_inputs(case: dict, world_size: int) -> list:
    """Per rank: its model's initial state (rank-dependent) and its micro-batches."""
    if "sizes" in case:
        return [None] * world_size
    return [{"state": make_model(case, r).state_dict(),
             "batches": micro_batches(case, r, world_size)} for r in range(world_size)]


def _state(model: nn.Module) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


class Gate(torch.autograd.Function):
    """Identity forward; backward returns grad · s, with s = ``ask()`` asked when backward
    reaches this point (the courier's gate in a rank, a fixed schedule in the reference).
    Shapes: h (batch, d_hid) → the same tensor's values; grad (batch, d_hid) → (batch, d_hid)."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, ask: Callable[[], float]) -> torch.Tensor:
        ctx.ask = ask
        return h.view_as(h)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.ask(), None  # a Python float: stays on grad's device and dtype


def first_layer(model: nn.Module) -> nn.Linear:
    """The layer whose output passes through `Gate`: its parameters are the last bucket's."""
    return model.a if isinstance(model, Toy) else model.layers[0]


def install_gate(model: nn.Module, ask: Callable[[], float]) -> RemovableHandle:
    """Route every forward's first-layer output through `Gate` with `ask` (a forward hook)."""
    return first_layer(model).register_forward_hook(lambda _m, _x, out: Gate.apply(out, ask))


def _step(ddp, call, step: int, batches: list) -> None:
    """One training step: k − 1 micro-batches inside no_sync(), the last one synchronised (each
    backward asks one gate, `Gate`)."""
    use = {"use_side": True} if uses_side(call.case, step) else {}
    k = len(batches)
    with call.section(f"quiet{step}"):
        if k > 1:  # only the no_sync checks need no_sync() to exist
            with ddp.no_sync():
                for x, y in batches[:-1]:
                    (F.mse_loss(ddp(x, **use), y) / k).backward()
    x, y = batches[-1]
    with call.section(f"sync{step}"):
        loss = F.mse_loss(ddp(x, **use), y) / k
        loss.backward()


def _train(student, call):
    # The architecture, on this rank's device; the weights come next (copied onto it).
    model = make_model(call.case, call.rank).to(call.device)
    model.load_state_dict(call.inputs["state"])
    kwargs = {"bucket_cap_mb": call.case["cap"] / 2**20} if "cap" in call.case else {}
    ddp = student.DDP(model, **kwargs)
    install_gate(model, call.gate)  # after DDP(...): its constructor runs no forward
    after_init = _state(model)
    batches = [tuple(t.to(call.device) for t in b) for b in call.inputs["batches"]]
    params = [p for p in model.parameters() if p.requires_grad]
    before = []  # the weights each step starts from: what its gradients are computed at
    for step in range(int(call.case.get("steps", 3))):
        before.append(_state(model))
        for p in params:
            p.grad = None
        _step(ddp, call, step, batches)
        with torch.no_grad():
            for p in params:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-LR)
    return {"after_init": after_init, "before": before, "final": _state(model)}


def _buckets(student, call):
    out = []
    for sizes in call.case["sizes"]:
        tensors = [torch.zeros(n, device=call.device) for n in sizes]
        for cap in call.case["caps"]:
            got = student.assign_buckets(tensors, cap)
            out.append({"sizes": sizes, "cap": cap,
                        "buckets": [[int(i) for i in b] for b in got]})
    return out


CALLS = {"train": _train, "buckets": _buckets}
