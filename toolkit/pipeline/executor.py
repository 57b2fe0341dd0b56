"""Run a pipeline schedule on real ranks: stages by layer, activations and gradients by isend.

`run_pipeline(layers, x, y, schedule=..., p=..., m=...)` spawns p gloo ranks. Rank r builds its
chunks from the layers it owns (`assign_layers`), splits the batch into m micro-batches
(`torch.tensor_split`: the first B mod m are one row longer), and runs its list of the
`Schedule` in order (`run_stage`, which a lab can spawn itself):

* F(mb) on virtual stage k: receive the activation from k−1 (``irecv``, posted one op ahead
  and waited on before the op: the only place a rank blocks), run the chunk, ``isend`` the
  output to k+1. The last virtual stage computes the loss: ``loss_fn(out, y_mb)`` scaled by
  rows(mb)/B, so the micro-batch losses add up to the full batch's mean loss and the
  gradients to its gradient.
* B(mb) on k: receive dL/d(output) from k+1 (or start from the loss), backpropagate through the
  chunk, ``isend`` dL/d(input) to k−1. Each message has its own tag (micro-batch, virtual stage,
  direction), so it can only land in the buffer meant for it.

Sends never block, so a schedule that passes `check_schedule` cannot deadlock here. Every op is
timed (``time.perf_counter``, one system-wide monotonic clock for all ranks on a machine):
``wait`` is the time blocked on the input message, ``start``/``end`` the compute. The measured
table has the simulator's columns (`toolkit.pipeline.simulate`), in seconds from the first op.

Activation memory is counted, not guessed: a ``saved_tensors_hooks`` pack hook adds up the bytes
of the tensors autograd saves for backward during each forward (parameters excluded, each
tensor once), and the held total rises at F and falls at B; `PipelineRun.peak_bytes` is its
maximum per stage.

Layer assignment: with v = 1, p stages get ``tensor_split``'s shares of the layers (the first
L mod p stages one layer more); with v > 1 every stage needs the same number of layers L/p and
v must divide it: virtual stage k = c·p + r (chunk c of rank r) holds layers
[k·L/(pv), (k+1)·L/(pv)). Parameters shared by layers on different ranks (tied weights) are not
supported: each rank would hold only its share of the gradient.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import pandas as pd
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from ..arguments import check_ints
from ..chunks import chunk_bounds  # the torch.tensor_split rule, shared with every split
from .schedules import Op, Schedule, make_schedule
from .simulate import COLUMNS, idle_fraction
from .validate import check_schedule
from .work import no_delay

LossFn = Callable[[Tensor, Tensor], Tensor]


def assign_layers(n_layers: int, *, p: int, v: int = 1) -> list[list[range]]:
    """Per rank, per chunk, the range of layer indices it holds (see the module docstring)."""
    check_ints("assign_layers", p=p, v=v, n_layers=n_layers)
    if p > n_layers:
        raise ValueError(f"p (stages) = {p} is more than the {n_layers} layers: every stage "
                         f"needs at least one layer; use p <= {n_layers} or more layers")
    if v == 1:
        return [[range(start, stop)] for start, stop in chunk_bounds(n_layers, p)]
    if n_layers % p:
        raise ValueError(f"v (chunks per rank) = {v} needs the same number of layers on every "
                         f"stage, but {n_layers} layers do not split into p = {p} equal stages; "
                         f"use a layer count divisible by p, or v = 1")
    per_stage = n_layers // p
    if per_stage % v:
        choices = [d for d in range(1, per_stage + 1) if per_stage % d == 0]
        raise ValueError(f"v (chunks per rank) = {v} must divide the layers per stage "
                         f"({n_layers} layers / p = {p} = {per_stage}); choose v in {choices}")
    size = per_stage // v
    return [[range((c * p + r) * size, (c * p + r + 1) * size) for c in range(v)]
            for r in range(p)]


@dataclass
class PipelineRun:
    """What `run_pipeline` measured."""

    schedule: Schedule
    """The schedule that ran."""
    table: pd.DataFrame
    """One row per op: ``stage, op, mb, chunk, start, end, duration, wait`` (seconds from the
    first op's start)."""
    grads: dict[str, Tensor]
    """Gradient of every trainable parameter, named as in ``nn.Sequential(*layers)``:
    ``"3.weight"`` (frozen parameters are left out)."""
    loss: float
    """The full batch's loss (the micro-batch losses, weighted by their share of rows)."""
    peak_bytes: list[int]
    """Per stage, the most bytes of saved activations held at once."""
    mb_bytes: list[dict[tuple[int, int], int]]
    """Per stage, bytes saved by each (micro-batch, chunk)'s forward."""
    layers: list[list[range]] = field(default_factory=list)
    """Per rank, per chunk, the layer indices it ran (`assign_layers`)."""

    @property
    def makespan(self) -> float:
        """Seconds from the first op's start to the last op's end."""
        return float(self.table["end"].max() - self.table["start"].min())

    @property
    def bubble(self) -> float:
        """Measured idle fraction, 1 − busy / (p · makespan)."""
        return idle_fraction(self.table, self.schedule.p)


def _mse(out: Tensor, y: Tensor) -> Tensor:
    return F.mse_loss(out, y)


def _tag(mb: int, virtual: int, n_virtual: int, backward: bool) -> int:
    """A message's own tag: who sends it (virtual stage), for which micro-batch, which way."""
    return (mb * n_virtual + virtual) * 2 + int(backward)


def _shapes(layers: Sequence[nn.Module], bounds: list[range], micro: list[Tensor]
            ) -> dict[tuple[int, int], tuple[torch.Size, torch.dtype]]:
    """(virtual stage, mb) -> shape and dtype of that stage's output: one sample through a copy
    of the model in eval mode (no grad, `Delay`s off, the RNG state restored, so nothing the
    real step sees changes), its batch dimension then set to each micro-batch's. (The "meta"
    device would need no compute, but its first use costs ~1 s per process.)
    """
    out = {}
    h = micro[0][:1]
    probe = [copy.deepcopy(layer).eval() for layer in layers]
    with torch.no_grad(), no_delay(), torch.random.fork_rng():
        for k, rng in enumerate(bounds):
            for i in rng:
                h = probe[i](h)
            for mb, xb in enumerate(micro):
                out[k, mb] = (torch.Size((len(xb),) + tuple(h.shape[1:])), h.dtype)
    return out


def run_stage(rank: int, world_size: int, layers: Sequence[nn.Module], x: Tensor, y: Tensor,
              schedule: Schedule, loss_fn: LossFn | None = None) -> dict:
    """One rank's part of a pipeline step (run by `spawn`; every rank gets the same arguments).

    Returns a dict: ``rows`` (timeline rows, absolute ``perf_counter`` seconds), ``grads``,
    ``loss`` (last stage, else 0), ``peak_bytes``, ``mb_bytes``.
    """
    s, loss_fn = schedule, loss_fn or _mse
    p, v, n_virtual = s.p, s.v, s.p * s.v
    if world_size != p:
        raise ValueError(f"run_stage: the schedule has p = {p} stages but {world_size} ranks run")
    ranges = assign_layers(len(layers), p=p, v=v)
    bounds = [ranges[k % p][k // p] for k in range(n_virtual)]
    chunks = [nn.Sequential(*(layers[i] for i in ranges[rank][c])) for c in range(v)]
    owned = {f"{i}.{name}": param for c in range(v) for i in ranges[rank][c]
             for name, param in layers[i].named_parameters() if param.requires_grad}
    for param in owned.values():
        param.grad = None               # a forked rank may inherit the caller's gradients
    param_ptrs = {prm.untyped_storage().data_ptr() for layer in layers
                  for prm in layer.parameters()}
    micro_x, micro_y = torch.tensor_split(x, s.m), torch.tensor_split(y, s.m)
    shapes = _shapes(layers, bounds, list(micro_x))

    ops = s.stages[rank]
    posted: dict[int, tuple] = {}        # op index -> (work, buffer) of its pre-posted receive
    local: dict[int, Tensor] = {}         # messages to this same rank (p = 1), by tag
    sends: list = []

    def post(i: int) -> None:
        """Post the receive of op i's input. Posting the next op's receive before computing
        this one lets the message land meanwhile, as Megatron-LM does."""
        if i >= len(ops) or i in posted:
            return
        op, k = ops[i], s.virtual_stage(rank, ops[i].chunk)
        if op.kind == "F" and k > 0:
            src, tag, (shape, dtype) = (k - 1) % p, _tag(op.mb, k - 1, n_virtual, False), \
                shapes[k - 1, op.mb]
        elif op.kind == "B" and k < n_virtual - 1:
            src, tag, (shape, dtype) = (k + 1) % p, _tag(op.mb, k + 1, n_virtual, True), \
                shapes[k, op.mb]
        else:
            posted[i] = (None, None)
            return
        if src == rank:
            posted[i] = ("local", tag)
            return
        buf = torch.empty(shape, dtype=dtype)
        posted[i] = (dist.irecv(buf, src=src, tag=tag), buf)

    def receive(i: int) -> Tensor | None:
        work, buf = posted.pop(i)
        if work is None:
            return None
        if isinstance(work, str):         # "local": the tensor never left this rank
            return local.pop(buf)
        work.wait()                       # the only place a rank blocks
        return buf

    def send(t: Tensor, dst: int, tag: int) -> None:
        if dst == rank:
            local[tag] = t
        else:
            sends.append((dist.isend(t, dst=dst, tag=tag), t))

    stash: dict[tuple[int, int], tuple[Tensor | None, Tensor]] = {}
    mb_bytes: dict[tuple[int, int], int] = {}
    held = peak = 0
    rows, loss_total = [], 0.0
    for i, op in enumerate(ops):
        k = s.virtual_stage(rank, op.chunk)
        ready = time.perf_counter()
        post(i)
        post(i + 1)
        data = receive(i)
        start = time.perf_counter()
        if op.kind == "F":
            inp = micro_x[op.mb] if k == 0 else data.requires_grad_()
            seen: set[tuple[int, int]] = set()
            saved = 0

            def pack(t: Tensor) -> Tensor:
                # The tensor's own bytes, not its storage's: a micro-batch of x is a view into
                # the whole batch. Once per tensor (a ReLU's output is the next Linear's input).
                nonlocal saved
                key = (t.data_ptr(), t.numel())
                if t.untyped_storage().data_ptr() not in param_ptrs and key not in seen:
                    seen.add(key)
                    saved += t.numel() * t.element_size()
                return t

            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = chunks[op.chunk](inp)
                if k == n_virtual - 1:
                    out = loss_fn(out, micro_y[op.mb]) * (len(micro_x[op.mb]) / len(x))
                    loss_total += float(out.detach())
            end = time.perf_counter()           # compute done; posting the send is not compute
            if k < n_virtual - 1:
                send(out.detach(), (k + 1) % p, _tag(op.mb, k, n_virtual, False))
            stash[op.mb, op.chunk] = (inp if k > 0 else None, out)
            mb_bytes[op.mb, op.chunk] = saved
            held += saved
            peak = max(peak, held)
        else:
            inp, out = stash.pop((op.mb, op.chunk))
            if out.requires_grad:       # a stage 0 of frozen layers has nothing to backprop
                torch.autograd.backward(out, data)
            end = time.perf_counter()
            if inp is not None:
                send(inp.grad, (k - 1) % p, _tag(op.mb, k, n_virtual, True))
            held -= mb_bytes[op.mb, op.chunk]
        rows.append((rank, op.kind, op.mb, op.chunk, start, end, end - start, start - ready))
    for work, _ in sends:
        work.wait()
    grads = {name: (prm.grad.detach().clone() if prm.grad is not None else torch.zeros_like(prm))
             for name, prm in owned.items()}     # trainable parameters only
    return {"rows": rows, "grads": grads, "loss": loss_total, "peak_bytes": peak,
            "mb_bytes": mb_bytes}


def run_pipeline(layers: Sequence[nn.Module] | nn.Sequential, x: Tensor, y: Tensor, *,
                 schedule: str | Schedule = "1f1b", p: int | None = None, m: int | None = None,
                 v: int | None = None, loss_fn: LossFn | None = None,
                 timeout: float = 60.0) -> PipelineRun:
    """One training step's forward and backward of ``nn.Sequential(*layers)`` on (x, y), run as a
    pipeline on p gloo ranks (`toolkit.launch.spawn`) with the given schedule.

    `schedule` is a name (``"naive"``, ``"gpipe"``, ``"1f1b"``, ``"interleaved"``; then p is
    required, m defaults to 1, v to 1) or a `Schedule` (which fixes p, m and v; it is checked
    with `check_schedule` first, so a bad one raises `ScheduleError` instead of hanging).
    `loss_fn(out, y)` must average over samples (default: mean squared error).
    """
    if isinstance(layers, nn.Module) and not isinstance(layers, (nn.Sequential, nn.ModuleList)):
        raise ValueError(f"run_pipeline: layers must be a list of modules to cut into stages "
                         f"(e.g. model.layers), got a {type(layers).__name__}")
    layers = list(layers)
    if isinstance(schedule, Schedule):
        for arg, given, have in (("p", p, schedule.p), ("m", m, schedule.m), ("v", v, schedule.v)):
            if given is not None and given != have:
                raise ValueError(f"run_pipeline: {arg} = {given} disagrees with the schedule "
                                 f"passed ({arg} = {have}); leave {arg} out")
        sched = check_schedule(schedule)
    else:
        if p is None:
            raise ValueError("run_pipeline: pass p, the number of stages (ranks)")
        check_ints("run_pipeline", p=p, m=1 if m is None else m, v=1 if v is None else v)
        sched = make_schedule(schedule, p=p, m=m or 1, v=v or 1)
    ranges = assign_layers(len(layers), p=sched.p, v=sched.v)
    if len(x) != len(y):
        raise ValueError(f"run_pipeline: x has {len(x)} samples but y has {len(y)}")
    if sched.m > len(x):
        raise ValueError(f"run_pipeline: m (micro-batches) = {sched.m} is more than the batch's "
                         f"{len(x)} samples; use m <= {len(x)}")
    from ..launch import spawn   # late: the launcher is only needed to run

    results = spawn(run_stage, sched.p, layers, x, y, sched, loss_fn, timeout=timeout,
                    echo=False)
    table = pd.DataFrame([row for res in results for row in res["rows"]],
                         columns=COLUMNS + ["wait"])
    t0 = table["start"].min()
    table[["start", "end"]] -= t0
    table = table.sort_values(["stage", "start"], kind="stable").reset_index(drop=True)
    grads = {name: g for res in results for name, g in res["grads"].items()}
    order = {name: i for i, (name, _) in enumerate(nn.Sequential(*layers).named_parameters())}
    grads = dict(sorted(grads.items(), key=lambda kv: order.get(kv[0], len(order))))
    return PipelineRun(schedule=sched, table=table, grads=grads,
                       loss=sum(res["loss"] for res in results),
                       peak_bytes=[res["peak_bytes"] for res in results],
                       mb_bytes=[res["mb_bytes"] for res in results], layers=ranges)


__all__ = ["PipelineRun", "assign_layers", "run_pipeline", "run_stage"]
