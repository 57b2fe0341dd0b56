"""ZeRO++'s quantized collectives on real ranks, beside the exact fp32 ones, on a real model's
weights and gradient.

`exchange` gives every rank a TinyGPT (the lesson's), flattens its parameters into Ψ elements
zero-padded to p·c, and takes this rank's slice as its shard (ZeRO-3's layout), and this rank's
gradient on its own batch. It then runs, each under its own recording:

    qwZ   `zeropp.quantized_all_gather(shard, bits=8)`   beside `all_gather_flat(shard)`
    qgZ   `zeropp.quantized_reduce_scatter(grad, bits=4)` beside an fp32 reduce-scatter

and returns per rank the recorded bytes of each, the largest error against the exact result,
and that error over its bound: half a quantization step per element (qwZ), the mean over ranks
of half of each rank's step (qgZ). Wang et al. 2023 (arXiv:2306.10209), §3; the byte formulas
are `toolkit.cost.compression.block_quantized_bytes`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from .. import comm
from ..arguments import check_int
from ..comm.flat import reduce_scatter_into
from ..data_parallel.compression import all_gather_flat
from ..data_parallel.quantize import block_quantize
from ..data_parallel.zeropp import quantized_all_gather, quantized_reduce_scatter
from ..launch import device, spawn
from .training import Task

__all__ = ["Exchange", "exchange"]


@dataclass(frozen=True)
class Exchange:
    """One rank's view of the two exchanges."""

    numel: int
    """Ψ, the model's parameters."""
    shard: int
    """c, elements per rank (Ψ padded to p·c)."""
    bytes: dict
    """Recorded bytes passed in per exchange: ``qwZ``, ``fp32 all-gather``, ``qgZ``,
    ``fp32 reduce-scatter``."""
    ops: dict
    """The collectives each exchange made, by name."""
    max_error: dict
    """``qwZ`` / ``qgZ``: the largest |quantized − exact| over elements."""
    error_over_bound: dict
    """``qwZ`` / ``qgZ``: the largest error / bound over elements (≤ 1 when the bound holds)."""


def _bound_per_element(x: torch.Tensor, *, bits: int, block: int) -> torch.Tensor:
    """Half of each element's quantization step, (n,)."""
    _, scales = block_quantize(x, bits=bits, block=block)
    return (scales / 2).repeat_interleave(block)[: x.numel()]


def _exchange(rank: int, world_size: int, task: Task, block: int) -> Exchange:
    dev = device()
    x, y = task.data(dev)
    model = task.model(dev)
    xb, yb = task.batch(x, y, step=0, rank=rank, world_size=world_size, batch=8)
    task.loss(model, xb, yb).backward()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    numel = flat.numel()
    c = -(-numel // world_size)
    flat = torch.cat([flat, flat.new_zeros(world_size * c - numel)])
    grad = torch.cat([grad, grad.new_zeros(world_size * c - numel)])
    shard = flat[rank * c: (rank + 1) * c].clone()
    traces, out = {}, {}
    with comm.recording() as traces["qwZ"]:
        out["qwZ"] = quantized_all_gather(shard, bits=8, block=block)
    with comm.recording() as traces["fp32 all-gather"]:
        exact_weights = all_gather_flat(shard)
    with comm.recording() as traces["qgZ"]:
        out["qgZ"] = quantized_reduce_scatter(grad, bits=4, block=block)
    with comm.recording() as traces["fp32 reduce-scatter"]:
        summed = grad.new_empty(c)
        reduce_scatter_into(summed, grad)
    exact = {"qwZ": exact_weights, "qgZ": summed / world_size}
    # Bounds: every rank's half-steps for its own shard (qwZ); for qgZ each rank quantized its
    # copy of my chunk with its own scales, so the mean error is within the mean half-step.
    shard_bounds = [torch.empty(c, device=dev) for _ in range(world_size)]
    dist.all_gather(shard_bounds, _bound_per_element(shard, bits=8, block=block))
    mine = grad.view(world_size, c)
    half_steps = torch.stack([_bound_per_element(chunk, bits=4, block=block) for chunk in mine])
    dist.all_reduce(half_steps)                  # row j: Σ over ranks of their half-steps
    bounds = {"qwZ": torch.cat(shard_bounds), "qgZ": half_steps[rank] / world_size}
    errors = {k: (out[k] - exact[k]).abs() for k in out}
    return Exchange(numel=numel, shard=c,
                    bytes={k: sum(e.nbytes for e in t.events) for k, t in traces.items()},
                    ops={k: [e.op for e in t.events] for k, t in traces.items()},
                    max_error={k: float(v.max()) for k, v in errors.items()},
                    error_over_bound={k: float((errors[k] / bounds[k].clamp_min(1e-30)).max())
                                      for k in errors})


def exchange(*, task: Task | None = None, world_size: int = 2, block: int = 256,
             timeout: float = 60) -> list[Exchange]:
    """Run qwZ and qgZ beside their fp32 counterparts on ``world_size`` ranks; one `Exchange`
    per rank."""
    check_int("exchange", "world_size", world_size)
    check_int("exchange", "block", block)
    return spawn(_exchange, world_size, task or Task("gpt"), block, timeout=timeout, echo=False)
