"""One rank's part of a pipeline step: its layers, and its list of the schedule run op by op.

Layer assignment (`assign_layers`): with v = 1, p stages get ``tensor_split``'s shares of the
layers (the first L mod p stages one layer more); with v > 1 every stage needs the same number of
layers L/p and v must divide it: virtual stage k = c·p + r (chunk c of rank r, Megatron-LM's
numbering, Narayanan et al. SC 2021 §2.2.2) holds layers [k·L/(pv), (k+1)·L/(pv)). In the V
layout (ZB-V) the layers are cut into 2p virtual stages (``tensor_split``'s shares) and rank r
holds virtual stages r (chunk 0) and 2p−1−r (chunk 1). In the bidirectional layout (Chimera,
Li & Hoefler SC 2021 §3.1; DualPipe) rank r holds stage r's share (chunk 0, the down pipeline)
and a replica of stage p−1−r's (chunk 1, the up pipeline).

`run_stage` runs the rank's ops in order; each one is receive → compute → send:

* F(mb) at position k of the micro-batch's path: the activation from k−1 (position 0: micro-batch
  mb of x, rows split as ``torch.tensor_split`` does), the chunk's forward, the output to k+1.
  The last position computes the loss, ``loss_fn(out, y_mb)`` scaled by rows(mb)/B, so the
  micro-batch losses add up to the full batch's mean loss and the gradients to its gradient.
* B(mb) at k: dL/d(output) from k+1 (the last position starts from its loss), backward through
  the chunk, dL/d(input) to k−1; when W(mb) is on the stage too, only the input gradient, and
  W(mb) later adds the weight gradients (`toolkit.pipeline.compute`).

After the last op, a bidirectional schedule's two replicas of each stage add their gradients:
rank r and rank p−1−r swap the gradients of the replica they hold for the other (one message
each way, recorded like the rest), so every stage's gradient comes back once, complete.

Messages are `toolkit.pipeline.messages`'s; what is computed and the activation bytes held are
`toolkit.pipeline.compute`'s.
"""

from __future__ import annotations

import copy
import time
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..arguments import check_ints
from ..chunks import chunk_bounds  # the torch.tensor_split rule, shared with every split
from .compute import LossFn, StageCompute
from .messages import Mailbox, Routes, swap
from .schedules import Schedule
from .work import no_delay


def assign_layers(n_layers: int, *, p: int, v: int = 1,
                  layout: str = "loop") -> list[list[range]]:
    """Per rank, per chunk, the range of layer indices it holds (see the module docstring)."""
    check_ints("assign_layers", p=p, v=v, n_layers=n_layers)
    if p > n_layers:
        raise ValueError(f"p (stages) = {p} is more than the {n_layers} layers: every stage "
                         f"needs at least one layer; use p <= {n_layers} or more layers")
    if layout == "bidirectional":
        stages = [range(start, stop) for start, stop in chunk_bounds(n_layers, p)]
        return [[stages[r], stages[p - 1 - r]] for r in range(p)]
    if layout == "v":
        if 2 * p > n_layers:
            raise ValueError(f"the V layout cuts the model into 2p = {2 * p} chunks, more than "
                             f"its {n_layers} layers; use p <= {n_layers // 2} or more layers")
        parts = [range(start, stop) for start, stop in chunk_bounds(n_layers, 2 * p)]
        return [[parts[r], parts[2 * p - 1 - r]] for r in range(p)]
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


def _layers_at(s: Schedule, ranges: list[list[range]]) -> list[range]:
    """The layer range at each position of a micro-batch's path."""
    return [ranges[r][c] for r, c in (s.place(k, 0) for k in range(s.depth))]


def _sum_replicas(rank: int, s: Schedule, layers: Sequence[nn.Module],
                  ranges: list[list[range]], device: torch.device) -> None:
    """Bidirectional: add the up-pipeline replica's gradients of stage r (held by rank p−1−r)
    into this rank's stage r, by swapping flat gradients with that rank."""
    peer = s.p - 1 - rank
    if peer == rank:                  # odd p: both pipelines' stage is this very module
        return

    def trainable(rng: range) -> list[nn.Parameter]:
        return [q for i in rng for q in layers[i].parameters() if q.requires_grad]

    own, replica = trainable(ranges[rank][0]), trainable(ranges[rank][1])   # stage r, p−1−r
    flat = [q.grad.reshape(-1) if q.grad is not None else torch.zeros_like(q).reshape(-1)
            for q in replica]
    outgoing = torch.cat(flat) if flat else torch.zeros(0, device=device)
    incoming = swap(outgoing, peer, numel=sum(q.numel() for q in own))   # peer's replica of r
    offset = 0
    for q in own:
        part = incoming[offset:offset + q.numel()].view_as(q)
        q.grad = part.clone() if q.grad is None else q.grad + part
        offset += q.numel()


def run_stage(rank: int, world_size: int, layers: Sequence[nn.Module], x: Tensor, y: Tensor,
              schedule: Schedule, loss_fn: LossFn | None = None) -> dict:
    """One rank's part of a pipeline step (run by `spawn`; every rank gets the same arguments).

    Returns a dict: ``rows`` (timeline rows ``(stage, op, mb, chunk, start, end, duration,
    wait)``, absolute ``perf_counter`` seconds), ``grads``, ``loss`` (last stage, else 0),
    ``peak_bytes``, ``mb_bytes`` (saved by each forward), ``grad_bytes`` (output gradients
    kept from each B to its W; empty without W ops).
    """
    s = schedule
    if world_size != s.p:
        raise ValueError(f"run_stage: the schedule has p = {s.p} stages but {world_size} ranks run")
    ranges = assign_layers(len(layers), p=s.p, v=s.v, layout=s.layout)
    routes = Routes(s, rank)
    # The gradients this rank returns: all its chunks' (loop, v), or its own stage's, to which
    # the replica's are added (bidirectional).
    kept = ranges[rank][:1] if s.layout == "bidirectional" else ranges[rank]
    owned = {f"{i}.{name}": param for rng in kept for i in rng
             for name, param in layers[i].named_parameters() if param.requires_grad}
    for rng in ranges[rank]:
        for i in rng:
            for param in layers[i].parameters():
                param.grad = None       # a forked rank may inherit the caller's gradients
    chunks = [nn.Sequential(*(layers[i] for i in rng)) for rng in ranges[rank]]
    compute = StageCompute(chunks, [q for layer in layers for q in layer.parameters()], x, y,
                           s.m, loss_fn or _mse, s.depth - 1, split=s.split, retain=s.sequence)
    split = s.split_on(rank)                    # the backwards this rank splits into B and W
    shapes = _shapes(layers, _layers_at(s, ranges), list(compute.micro_x))
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
            sent = compute.forward(op, k, received).detach()
        elif op.kind == "W":
            sent = compute.backward_weight(op)  # nothing to send
        elif (op.mb, op.chunk) in split:
            sent = compute.backward_input(op, received)
        else:
            sent = compute.backward(op, received)
        end = time.perf_counter()               # compute done; posting the send is not compute
        route = routes.outgoing(op)
        if route is not None:                   # send
            mailbox.send(sent, route)
        rows.append((rank, op.kind, op.mb, op.chunk, start, end, end - start, start - ready))
    mailbox.finish()
    if s.layout == "bidirectional":
        _sum_replicas(rank, s, layers, ranges, x.device)
    grads = {name: (prm.grad.detach().clone() if prm.grad is not None else torch.zeros_like(prm))
             for name, prm in owned.items()}     # trainable parameters only
    return {"rows": rows, "grads": grads, "loss": compute.loss, "peak_bytes": compute.peak,
            "mb_bytes": compute.mb_bytes, "grad_bytes": compute.grad_bytes}


__all__ = ["LossFn", "assign_layers", "run_stage"]
