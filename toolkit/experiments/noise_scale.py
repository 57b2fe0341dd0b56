"""The gradient noise scale of a small model, measured on ranks the way data parallelism allows,
and checked against per-example gradients.

McCandlish et al. 2018 (arXiv:1812.06162), Appendix A.1; the arithmetic is
`toolkit.cost.critical_batch`. On p ranks each taking b items, every step offers two gradient
norms for free: each rank's own, |G_small|² at B_small = b, and the all-reduced mean's,
|G_big|² at B_big = p·b. `measure` trains TinyMLP with DDP (momentum SGD) on `Task`'s items and,
at each step listed in ``at``, stops to draw ``repeats`` fresh batches without stepping: it
averages |G_small|² over ranks and draws and |G_big|² over draws, and estimates |G|², tr(Σ) and
B_simple = tr(Σ)/|G|² from those means (average first, divide last: the ratio of unbiased
estimates is not unbiased).

Beside each estimate, rank 0 computes the same quantities directly from per-example gradients
(`torch.func`: vmap of grad) of ``reference_items`` training items: G their mean, tr(Σ) their
variance summed over parameters (divided by N − 1). The two agree within the estimator's
sampling error; the direct one needs N gradients, the data-parallel one only what DDP computes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.distributed as dist
from torch.func import functional_call, grad, vmap

from ..arguments import check_int, check_positive
from ..cost.critical_batch import NoiseScale, noise_scale
from ..data_parallel.ddp import BucketedDDP
from ..launch import device, spawn
from .training import Task

__all__ = ["NoisePoint", "measure"]


@dataclass(frozen=True)
class NoisePoint:
    """The noise scale at one point of training."""

    step: int
    """Optimizer steps taken before the measurement."""
    loss: float
    """Held-out loss of the model measured."""
    g_small_sq: float
    """Mean |G_small|² over ranks and draws (batch b)."""
    g_big_sq: float
    """Mean |G_big|² over draws (batch p·b)."""
    b_small: int
    b_big: int
    direct: NoiseScale
    """|G|² and tr(Σ) from per-example gradients."""

    @property
    def estimate(self) -> NoiseScale:
        """McCandlish et al.'s Appendix A.1 estimate from the two mean norms."""
        return noise_scale(self.g_small_sq, self.g_big_sq, b_small=self.b_small,
                           b_big=self.b_big)


def _flat_grad(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def _direct(task: Task, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> NoiseScale:
    """|G|² and tr(Σ) of per-example gradients of (x, y): (N, Ψ) built by vmap over grad."""
    params = {k: v.detach() for k, v in model.named_parameters()}

    def one(p: dict, xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        return task.loss(lambda inp: functional_call(model, p, (inp,)), xi[None], yi[None])

    per = vmap(grad(one), in_dims=(None, 0, 0))(params, x, y)
    g = torch.cat([per[k].reshape(x.shape[0], -1) for k in params], dim=1)   # (N, Ψ)
    mean = g.mean(dim=0)
    trace = (g - mean).pow(2).sum(dim=1).sum() / (g.shape[0] - 1)
    return NoiseScale(grad_sq=float(mean.pow(2).sum()), trace=float(trace))


def _measure(rank: int, world_size: int, task: Task, at: list[int], repeats: int, batch: int,
             lr: float, reference_items: int) -> list[dict]:
    dev = device()
    x, y = task.data(dev)
    model = task.model(dev)
    ddp = BucketedDDP(model, bucket_cap_mb=64.0)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    out, done = [], 0
    for target in at:
        for step in range(done, target):                 # train up to the measuring point
            xb, yb = task.batch(x, y, step=step, rank=rank, world_size=world_size, batch=batch)
            opt.zero_grad()
            task.loss(ddp, xb, yb).backward()
            opt.step()
        done = target
        small = big = 0.0
        for j in range(repeats):                         # fresh draws, no step
            xb, yb = task.batch(x, y, step=10_007 + 97 * target + j, rank=rank,
                                world_size=world_size, batch=batch)
            model.zero_grad()
            with ddp.no_sync():                          # this rank's own gradient, B_small
                task.loss(ddp, xb, yb).backward()
            g = _flat_grad(model)
            small += float(g.pow(2).sum())
            dist.all_reduce(g)                           # the mean over ranks, B_big
            big += float(g.div_(world_size).pow(2).sum())
        mine = torch.tensor([small / repeats], device=dev)
        dist.all_reduce(mine)
        row = dict(step=target, g_small_sq=float(mine) / world_size, g_big_sq=big / repeats)
        if rank == 0:
            with torch.no_grad():
                row["loss"] = task.loss(model, *task.held_out(x, y)).item()
            row["direct"] = _direct(task, model, x[:reference_items], y[:reference_items])
        out.append(row)
    return out


def measure(*, task: Task | None = None, world_size: int = 2, batch: int = 8,
            at: Sequence[int] = (0, 32, 128), repeats: int = 32, lr: float = 0.1,
            reference_items: int = 1024, timeout: float = 120) -> list[NoisePoint]:
    """The noise scale of ``task``'s TinyMLP at each step in ``at`` of one DDP run (module
    docstring): B_small = ``batch``, B_big = world_size·batch."""
    task = task or Task("mlp")
    if task.kind != "mlp":
        raise ValueError("measure: per-example gradients are computed for the MLP task only; "
                         f"got Task({task.kind!r})")
    check_int("measure", "world_size", world_size, low=2, hint="B_big = p·b needs p ≥ 2")
    check_int("measure", "batch", batch)
    check_int("measure", "repeats", repeats)
    check_int("measure", "reference_items", reference_items, low=2, high=task.items)
    check_positive("measure", "lr", lr)
    points = sorted(int(a) for a in at)
    if not points or points[0] < 0:
        raise ValueError(f"measure: at must list steps >= 0, got {list(at)}")
    rows = spawn(_measure, world_size, task, points, repeats, batch, lr, reference_items,
                 timeout=timeout, echo=False)[0]
    return [NoisePoint(step=r["step"], loss=r["loss"], g_small_sq=r["g_small_sq"],
                       g_big_sq=r["g_big_sq"], b_small=batch, b_big=world_size * batch,
                       direct=r["direct"]) for r in rows]
