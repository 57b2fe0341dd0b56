"""Local SGD and DiLoCo against every-step DDP, on real ranks and the same data.

Each `Variant` trains a fresh copy of one `Task`'s model on every rank for ``steps`` steps, rank
r taking the task's items for (step, r); the recorder counts the bytes each rank passes to
all-reduce at every step (`toolkit.comm`). What comes back per variant (`Run`): the training
loss per step (mean over ranks), rank 0's bytes per step, the held-out loss of the final
model, and whether the replicas ended equal. The byte counts are exact and deterministic:
`toolkit.cost.traffic.ddp_bytes` and `local_sgd_bytes` predict them. The losses depend on
floating-point order only.

    methods   ddp: `BucketedDDP` around the model, the inner optimizer steps every rank alike
              local_sgd: `LocalSGD(inner, sync_every=H)` (Stich 2019; Lin et al. 2020)
              diloco: `DiLoCo(inner, sync_every=H)`, outer SGD with Nesterov momentum
                      (Douillard et al. 2023, Algorithm 1)
    inner     sgd (momentum 0.9) or adamw (weight decay 0.1, betas 0.9/0.95)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from ..arguments import check_int, check_positive
from ..data_parallel.ddp import BucketedDDP
from ..data_parallel.local_sgd import DiLoCo, LocalSGD
from ..launch import device, spawn
from .training import Task, TrainedRun, mean_losses, train_recorded

__all__ = ["METHODS", "Run", "Variant", "compare"]

METHODS = ("ddp", "local_sgd", "diloco")


@dataclass(frozen=True)
class Variant:
    """One way to train: a method, how often it synchronises, and its optimizers."""

    name: str
    """Label in tables and figures."""
    method: str = "ddp"
    """One of `METHODS`."""
    sync_every: int = 1
    """H: local steps per synchronisation (1 for DDP)."""
    inner: str = "sgd"
    """The (inner) optimizer: ``"sgd"`` (momentum 0.9) or ``"adamw"``."""
    lr: float = 0.05
    """Its learning rate."""
    outer_lr: float = 0.7
    """DiLoCo's outer learning rate."""
    outer_momentum: float = 0.9
    """DiLoCo's outer (Nesterov) momentum."""

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"Variant {self.name!r}: method must be one of {METHODS}, "
                             f"got {self.method!r}")
        if self.inner not in ("sgd", "adamw"):
            raise ValueError(f"Variant {self.name!r}: inner must be 'sgd' or 'adamw', "
                             f"got {self.inner!r}")
        check_int(f"Variant {self.name!r}", "sync_every", self.sync_every, hint="H")
        if self.method == "ddp" and self.sync_every != 1:
            raise ValueError(f"Variant {self.name!r}: ddp synchronises every step; "
                             f"leave sync_every at 1 (got {self.sync_every})")
        check_positive(f"Variant {self.name!r}", "lr", self.lr)


@dataclass
class Run:
    """What one variant did: losses, recorded traffic, the final model's held-out loss."""

    variant: Variant
    losses: list[float]
    """Training loss at each step, mean over ranks."""
    bytes_per_step: list[int]
    """Rank 0's bytes passed to all-reduce at each step (0 on steps without a sync)."""
    all_reduces: int
    """Rank 0's all-reduce calls over the run."""
    final_loss: float
    """Held-out loss of rank 0's final model."""
    replicas_equal: bool
    """Whether every rank ended with bitwise the same parameters."""
    numel: int = field(default=0)
    """Ψ, parameters synchronised."""

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_per_step)


def _inner(variant: Variant, params: Sequence[torch.nn.Parameter]) -> torch.optim.Optimizer:
    if variant.inner == "sgd":
        return torch.optim.SGD(params, lr=variant.lr, momentum=0.9)
    # foreach: one kernel per op over all tensors, not a Python loop per tensor (~25 % of a
    # TinyGPT step on a CPU core); the same update, summed in another order.
    return torch.optim.AdamW(params, lr=variant.lr, betas=(0.9, 0.95), weight_decay=0.1,
                             foreach=True)


def _train(rank: int, world_size: int, task: Task, variants: list[Variant], steps: int,
           batch: int) -> list[TrainedRun]:
    dev = device()
    x, y = task.data(dev)
    out = []
    for variant in variants:
        model = task.model(dev)
        params = [p for p in model.parameters() if p.requires_grad]
        if variant.method == "ddp":
            forward = BucketedDDP(model)
            opt = _inner(variant, params)
        else:
            forward = model
            inner = _inner(variant, params)
            opt = (LocalSGD(inner, sync_every=variant.sync_every) if variant.method == "local_sgd"
                   else DiLoCo(inner, sync_every=variant.sync_every, outer_lr=variant.outer_lr,
                               momentum=variant.outer_momentum))
        out.append(train_recorded(task, model, forward, opt, x, y, steps=steps, rank=rank,
                                  world_size=world_size, batch=batch))
    return out


def compare(variants: Sequence[Variant], *, task: Task | None = None, world_size: int = 2,
            steps: int = 96, batch: int = 8, timeout: float = 120) -> list[Run]:
    """Train every variant on ``world_size`` ranks (one launch) and return their `Run`s."""
    check_int("compare", "world_size", world_size)
    check_int("compare", "steps", steps)
    check_int("compare", "batch", batch)
    if not variants:
        raise ValueError("compare: variants is empty; pass at least one Variant")
    task = task or Task()
    results = spawn(_train, world_size, task, list(variants), steps, batch, timeout=timeout,
                    echo=False)
    numel = sum(p.numel() for p in task.model().parameters() if p.requires_grad)   # Ψ
    runs = []
    for i, variant in enumerate(variants):
        per_rank = [r[i] for r in results]
        runs.append(Run(variant=variant, losses=mean_losses(per_rank),
                        bytes_per_step=per_rank[0].sent, all_reduces=sum(per_rank[0].calls),
                        final_loss=per_rank[0].final, replicas_equal=per_rank[0].equal,
                        numel=numel))
    return runs
