"""PowerSGD hooks side by side on real ranks: the course's and torch's, on both DDPs.

Each `HookRun` trains a fresh copy of a `Task`'s model with SGD (momentum 0.9, the momentum
of Vogels et al.'s Algorithm 2) for ``steps`` steps; the recorder counts every all-reduce
each rank makes per step. Variants (`HookVariant`):

    ddp="course"   `OverlappedDDP` (buckets of ``bucket_cap_mb``), hook via register_comm_hook
    ddp="torch"    ``torch.nn.parallel.DistributedDataParallel``, the same
    hook="none"    plain averaging (no hook): the uncompressed reference
    hook="course"  `toolkit.data_parallel.powersgd.powersgd_hook`
    hook="torch"   torch's ``powerSGD_hook``, wrapped in `in_order`: on gloo it issues
                   collectives from future callbacks in an order that differs between ranks
                   and hangs with several buckets (lesson 15); waiting for each bucket fixes
                   the order

All compressed variants start compressing after ``start_iter`` = 2 backward passes (torch
requires ≥ 2 with error feedback, because its DDP rebuilds buckets after the first); from then
on the bytes per step equal `toolkit.cost.traffic.powersgd_elements(...).total` × 4.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_powersgd
from torch.nn.parallel import DistributedDataParallel

from ..arguments import check_int, check_positive
from ..data_parallel.ddp import OverlappedDDP
from ..data_parallel.powersgd import PowerSGDState, in_order, powersgd_hook
from ..launch import device, spawn
from .training import Task, TrainedRun, mean_losses, train_recorded

__all__ = ["HookRun", "HookVariant", "START_ITER", "compare"]

START_ITER = 2
"""Backward passes of plain all-reduce before compressing, for every compressed variant."""


@dataclass(frozen=True)
class HookVariant:
    """Which DDP, which hook, which rank r."""

    name: str
    ddp: str = "course"
    """``"course"`` (`OverlappedDDP`) or ``"torch"`` (``DistributedDataParallel``)."""
    hook: str = "none"
    """``"none"``, ``"course"`` or ``"torch"``."""
    rank: int = 1
    """r, the rank of the approximation (ignored without a hook)."""

    def __post_init__(self) -> None:
        if self.ddp not in ("course", "torch"):
            raise ValueError(f"HookVariant {self.name!r}: ddp must be 'course' or 'torch', "
                             f"got {self.ddp!r}")
        if self.hook not in ("none", "course", "torch"):
            raise ValueError(f"HookVariant {self.name!r}: hook must be 'none', 'course' or "
                             f"'torch', got {self.hook!r}")
        check_int(f"HookVariant {self.name!r}", "rank", self.rank, hint="r")


@dataclass
class HookRun:
    """Losses and recorded all-reduce bytes of one variant."""

    variant: HookVariant
    losses: list[float]
    """Training loss per step, mean over ranks."""
    bytes_per_step: list[int]
    """Rank 0's bytes passed to all-reduce per step."""
    calls_per_step: list[int]
    """Rank 0's all-reduce calls per step (zero-byte ones included)."""
    final_loss: float
    """Held-out loss of rank 0's final model."""
    replicas_equal: bool
    """Whether every rank ended with bitwise the same parameters."""


def _wrap(variant: HookVariant, model: torch.nn.Module, cap_mb: float) -> torch.nn.Module:
    if variant.ddp == "course":
        ddp = OverlappedDDP(model, bucket_cap_mb=cap_mb)
    else:
        ddp = DistributedDataParallel(model, bucket_cap_mb=cap_mb)
    if variant.hook == "course":
        ddp.register_comm_hook(PowerSGDState(matrix_rank=variant.rank, start_iter=START_ITER),
                               powersgd_hook)
    elif variant.hook == "torch":
        state = torch_powersgd.PowerSGDState(process_group=None,
                                             matrix_approximation_rank=variant.rank,
                                             start_powerSGD_iter=START_ITER)
        ddp.register_comm_hook(state, in_order(torch_powersgd.powerSGD_hook))
    return ddp


def _train(rank: int, world_size: int, task: Task, variants: list[HookVariant], steps: int,
           batch: int, lr: float, cap_mb: float) -> list[TrainedRun]:
    dev = device()
    x, y = task.data(dev)
    out = []
    for variant in variants:
        model = task.model(dev)
        ddp = _wrap(variant, model, cap_mb)
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        out.append(train_recorded(task, model, ddp, opt, x, y, steps=steps, rank=rank,
                                  world_size=world_size, batch=batch))
    return out


def compare(variants: Sequence[HookVariant], *, task: Task | None = None, world_size: int = 2,
            steps: int = 48, batch: int = 8, lr: float = 0.2, bucket_cap_mb: float = 0.02,
            timeout: float = 120) -> list[HookRun]:
    """Train every variant on ``world_size`` ranks (one launch); return their `HookRun`s."""
    check_int("compare", "world_size", world_size)
    check_int("compare", "steps", steps)
    check_positive("compare", "lr", lr)
    check_positive("compare", "bucket_cap_mb", bucket_cap_mb)
    if not variants:
        raise ValueError("compare: variants is empty; pass at least one HookVariant")
    task = task or Task()
    results = spawn(_train, world_size, task, list(variants), steps, batch, lr, bucket_cap_mb,
                    timeout=timeout, echo=False)
    runs = []
    for i, variant in enumerate(variants):
        per_rank = [r[i] for r in results]
        runs.append(HookRun(variant=variant, losses=mean_losses(per_rank),
                            bytes_per_step=per_rank[0].sent, calls_per_step=per_rank[0].calls,
                            final_loss=per_rank[0].final, replicas_equal=per_rank[0].equal))
    return runs
