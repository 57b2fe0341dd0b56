"""One rank's part of a pipeline step: its layers, and its list of the schedule run op by op.

Layer assignment (`assign_layers`): with v = 1, p stages get ``tensor_split``'s shares of the
layers (the first L mod p stages one layer more); with v > 1 every stage needs the same number of
layers L/p and v must divide it: virtual stage k = c·p + r (chunk c of rank r, Megatron-LM's
numbering, Narayanan et al. SC 2021 §2.2.2) holds layers [k·L/(pv), (k+1)·L/(pv)).

`run_stage` runs the rank's ops in order; each one is receive → compute → send:

* F(mb) on virtual stage k: the activation from k−1 (stage 0: micro-batch mb of x, rows split
  as ``torch.tensor_split`` does), the chunk's forward, the output to k+1. The last virtual stage
  computes the loss, ``loss_fn(out, y_mb)`` scaled by rows(mb)/B, so the micro-batch losses add
  up to the full batch's mean loss and the gradients to its gradient.
* B(mb) on k: dL/d(output) from k+1 (the last stage starts from its loss), backward through the
  chunk, dL/d(input) to k−1.

Messages are `toolkit.pipeline.messages`'s. Activation memory is counted, not guessed: a
``saved_tensors_hooks`` pack hook adds up the bytes of the tensors autograd saves during each
forward (parameters excluded, each tensor once); the held total rises at F and falls at B.
"""

from __future__ import annotations

import copy
import time
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..arguments import check_ints
from ..chunks import chunk_bounds  # the torch.tensor_split rule, shared with every split
from .messages import Mailbox, Routes
from .schedules import Op, Schedule
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


def _mse(out: Tensor, y: Tensor) -> Tensor:
    return F.mse_loss(out, y)


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


class _Compute:
    """What one rank computes: its chunks, the micro-batches, the tensors kept from each
    forward for its backward, and the bytes of saved activations held."""

    def __init__(self, layers: Sequence[nn.Module], ranges: list[list[range]], rank: int,
                 x: Tensor, y: Tensor, m: int, loss_fn: LossFn, n_virtual: int) -> None:
        self.chunks = [nn.Sequential(*(layers[i] for i in rng)) for rng in ranges[rank]]
        self.param_ptrs = {prm.untyped_storage().data_ptr() for layer in layers
                           for prm in layer.parameters()}
        self.micro_x, self.micro_y = torch.tensor_split(x, m), torch.tensor_split(y, m)
        self.rows, self.loss_fn, self.last = len(x), loss_fn, n_virtual - 1
        self.stash: dict[tuple[int, int], tuple[Tensor | None, Tensor]] = {}
        self.mb_bytes: dict[tuple[int, int], int] = {}
        self.held = self.peak = 0
        self.loss = 0.0

    def forward(self, op: Op, k: int, received: Tensor | None) -> Tensor:
        """Run chunk `op.chunk` on its input (x's micro-batch on virtual stage 0); returns the
        output (the scaled loss on the last virtual stage), keeps what backward needs."""
        inp = self.micro_x[op.mb] if k == 0 else received.requires_grad_()
        seen: set[tuple[int, int]] = set()
        saved = 0

        def pack(t: Tensor) -> Tensor:
            # The tensor's own bytes, not its storage's: a micro-batch of x is a view into the
            # whole batch. Once per tensor (a ReLU's output is the next Linear's input).
            nonlocal saved
            key = (t.data_ptr(), t.numel())
            if t.untyped_storage().data_ptr() not in self.param_ptrs and key not in seen:
                seen.add(key)
                saved += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = self.chunks[op.chunk](inp)
            if k == self.last:  # the loss, weighted by this micro-batch's share of the rows
                share = len(self.micro_x[op.mb]) / self.rows
                out = self.loss_fn(out, self.micro_y[op.mb]) * share
                self.loss += float(out.detach())
        self.stash[op.mb, op.chunk] = (inp if k > 0 else None, out)
        self.mb_bytes[op.mb, op.chunk] = saved
        self.held += saved
        self.peak = max(self.peak, self.held)
        return out

    def backward(self, op: Op, grad: Tensor | None) -> Tensor | None:
        """Backward of `op.chunk` for micro-batch `op.mb`; returns dL/d(input) (None on virtual
        stage 0, whose input is data) and frees the forward's saved activations."""
        inp, out = self.stash.pop((op.mb, op.chunk))
        if out.requires_grad:       # a stage 0 of frozen layers has nothing to backprop
            torch.autograd.backward(out, grad)
        self.held -= self.mb_bytes[op.mb, op.chunk]
        return None if inp is None else inp.grad


def run_stage(rank: int, world_size: int, layers: Sequence[nn.Module], x: Tensor, y: Tensor,
              schedule: Schedule, loss_fn: LossFn | None = None) -> dict:
    """One rank's part of a pipeline step (run by `spawn`; every rank gets the same arguments).

    Returns a dict: ``rows`` (timeline rows ``(stage, op, mb, chunk, start, end, duration,
    wait)``, absolute ``perf_counter`` seconds), ``grads``, ``loss`` (last stage, else 0),
    ``peak_bytes``, ``mb_bytes``.
    """
    s = schedule
    if world_size != s.p:
        raise ValueError(f"run_stage: the schedule has p = {s.p} stages but {world_size} ranks run")
    ranges = assign_layers(len(layers), p=s.p, v=s.v)
    routes = Routes(s, rank)
    bounds = [ranges[k % s.p][k // s.p] for k in range(routes.n_virtual)]
    owned = {f"{i}.{name}": param for rng in ranges[rank] for i in rng
             for name, param in layers[i].named_parameters() if param.requires_grad}
    for param in owned.values():
        param.grad = None               # a forked rank may inherit the caller's gradients
    compute = _Compute(layers, ranges, rank, x, y, s.m, loss_fn or _mse, routes.n_virtual)
    shapes = _shapes(layers, bounds, list(compute.micro_x))
    ops, mailbox, rows = s.stages[rank], Mailbox(rank, x.device), []

    def post(i: int) -> None:
        if i < len(ops):
            op, route = ops[i], routes.incoming(ops[i])
            # An activation has the sender's output shape; a gradient has our own output's.
            k = routes.virtual(op) - 1 if op.kind == "F" else routes.virtual(op)
            mailbox.post(i, route, *(shapes[k, op.mb] if route else (None, None)))

    for i, op in enumerate(ops):
        k = routes.virtual(op)
        ready = time.perf_counter()
        post(i)
        post(i + 1)                             # the next op's input lands while we compute
        received = mailbox.receive(i)           # receive
        start = time.perf_counter()
        if op.kind == "F":                      # compute
            result = compute.forward(op, k, received)
            sent = result.detach()
        else:
            sent = compute.backward(op, received)
        end = time.perf_counter()               # compute done; posting the send is not compute
        route = routes.outgoing(op)
        if route is not None:                   # send
            mailbox.send(sent, route)
        rows.append((rank, op.kind, op.mb, op.chunk, start, end, end - start, start - ready))
    mailbox.finish()
    grads = {name: (prm.grad.detach().clone() if prm.grad is not None else torch.zeros_like(prm))
             for name, prm in owned.items()}     # trainable parameters only
    return {"rows": rows, "grads": grads, "loss": compute.loss, "peak_bytes": compute.peak,
            "mb_bytes": compute.mb_bytes}


__all__ = ["LossFn", "assign_layers", "run_stage"]
