"""Large-batch training on real ranks: SGD under the linear scaling rule against LARS and LAMB.

Every `Recipe` trains a fresh copy of a `Task`'s model (default: the lesson's TinyMLP on 4,096
regression items) with `OverlappedDDP` on ``world_size`` ranks, global batch ``batch`` split
evenly, for ``epochs`` passes over the data in one seeded order shared by all ranks, with an
optional linear warm-up of the learning rate (Goyal et al. 2017, lesson 04). Returned per
recipe (`LargeBatchRun`): the training loss per step (mean over ranks), the loss over the whole
training set at the end, `blew_up` (the final loss is nan or inf) and `diverged` (blew up, or
ended no lower than at initialisation). All values are deterministic for a seed (the same
ranks, data and order).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from ..arguments import check_int, check_positive
from ..data_parallel.ddp import OverlappedDDP
from ..data_parallel.large_batch import LAMB, LARS
from ..launch import device, spawn
from .training import Task

__all__ = ["KINDS", "LargeBatchRun", "Recipe", "train"]

KINDS = ("sgd", "adam", "lars", "lamb")


@dataclass(frozen=True)
class Recipe:
    """An optimizer, its learning rate and warm-up."""

    name: str
    kind: str = "sgd"
    """One of `KINDS`: plain SGD, Adam, `LARS` (momentum 0.9, η = 0.001), `LAMB`."""
    lr: float = 0.05
    """Peak learning rate."""
    warmup_epochs: float = 0.0
    """Epochs of linear warm-up from lr/steps to lr (0: none)."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Recipe {self.name!r}: kind must be one of {KINDS}, "
                             f"got {self.kind!r}")
        check_positive(f"Recipe {self.name!r}", "lr", self.lr)
        if self.warmup_epochs < 0:
            raise ValueError(f"Recipe {self.name!r}: warmup_epochs must be >= 0, "
                             f"got {self.warmup_epochs!r}")

    def optimizer(self, params: Sequence[torch.nn.Parameter]) -> torch.optim.Optimizer:
        if self.kind == "sgd":
            return torch.optim.SGD(params, lr=self.lr)
        if self.kind == "adam":
            return torch.optim.Adam(params, lr=self.lr)
        if self.kind == "lars":
            return LARS(params, lr=self.lr, momentum=0.9)
        return LAMB(params, lr=self.lr)


@dataclass
class LargeBatchRun:
    """One recipe's run."""

    recipe: Recipe
    losses: list[float]
    """Training loss per step, mean over ranks."""
    initial_loss: float
    """Loss over the training set before the first step."""
    final_loss: float
    """Loss over the training set after the last step (nan or inf when it blew up)."""

    @property
    def blew_up(self) -> bool:
        """The final loss is nan or inf."""
        return not math.isfinite(self.final_loss)

    @property
    def diverged(self) -> bool:
        """Blew up, or ended no lower than it started."""
        return self.blew_up or self.final_loss >= self.initial_loss


def _train(rank: int, world_size: int, task: Task, recipes: list[Recipe], batch: int,
           epochs: int) -> list[dict]:
    dev = device()
    x, y = task.data(dev)
    x, y = x[:task.items], y[:task.items]
    per_rank = batch // world_size
    steps_per_epoch = task.items // batch
    out = []
    for recipe in recipes:
        model = task.model(dev)
        ddp = OverlappedDDP(model)
        opt = recipe.optimizer(list(model.parameters()))
        # One order for all ranks: a generator on the ranks' device (a GPU run shuffles
        # differently from a CPU run, but every rank of it alike).
        order = torch.Generator(device=dev).manual_seed(task.seed + 2)
        warm = recipe.warmup_epochs * steps_per_epoch
        with torch.no_grad():
            initial = task.loss(model, x, y).item()
        losses, step = [], 0
        for _ in range(epochs):
            perm = torch.randperm(task.items, generator=order, device=dev)
            for i in range(steps_per_epoch):
                if warm:
                    opt.param_groups[0]["lr"] = recipe.lr * min(1.0, (step + 1) / warm)
                mine = perm[i * batch + rank * per_rank: i * batch + (rank + 1) * per_rank]
                opt.zero_grad()
                loss = task.loss(ddp, x[mine], y[mine])
                loss.backward()
                opt.step()
                losses.append(loss.item())
                step += 1
        with torch.no_grad():
            final = task.loss(model, x, y).item()
        out.append(dict(losses=losses, initial=initial, final=final))
    return out


def train(recipes: Sequence[Recipe], *, task: Task | None = None, world_size: int = 2,
          batch: int = 512, epochs: int = 8, timeout: float = 120) -> list[LargeBatchRun]:
    """Train every recipe at global batch ``batch`` on ``world_size`` ranks (one launch)."""
    check_int("train", "world_size", world_size)
    check_int("train", "epochs", epochs)
    check_int("train", "batch", batch)
    task = task or Task("mlp")
    if batch % world_size or batch > task.items:
        raise ValueError(f"train: batch must be a multiple of world_size ({world_size}) and at "
                         f"most the task's {task.items} items, got {batch}")
    if not recipes:
        raise ValueError("train: recipes is empty; pass at least one Recipe")
    results = spawn(_train, world_size, task, list(recipes), batch, epochs, timeout=timeout,
                    echo=False)
    return [LargeBatchRun(recipe=recipe,
                          losses=[sum(v) / world_size for v in zip(*(r[i]["losses"]
                                                                     for r in results))],
                          initial_loss=results[0][i]["initial"], final_loss=results[0][i]["final"])
            for i, recipe in enumerate(recipes)]
