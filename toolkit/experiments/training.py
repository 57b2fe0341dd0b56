"""The small training task lesson 15's comparisons share: a model, its synthetic data, its loss,
and which items each rank trains on at each step, so that every method sees the same data.

``Task("gpt")``: a `TinyGPT` (2 layers, width 32, vocabulary 32, 8 tokens; tied embedding
and head) on `make_token_data`; ``Task("mlp")``: a `TinyMLP` (width 64, depth 4) on
`make_regression_data`. At step t rank r of p trains on items [(t·p + r)·b, (t·p + r + 1)·b)
of the training set (wrapping around): over p ranks a step covers p·b distinct items, as
one process would with a batch of p·b. The last `eval_items` items are held out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from .. import comm
from ..arguments import check_int
from ..models import GPTConfig, TinyGPT, TinyMLP, make_regression_data, make_token_data

__all__ = ["GPT_CONFIG", "MLP_SIZES", "Task", "TrainedRun", "mean_losses", "train_recorded"]

GPT_CONFIG = GPTConfig(vocab_size=32, seq_len=8, d_model=32, n_head=2, n_layer=2)
"""The lesson's TinyGPT: 26,752 parameters, a few milliseconds a step on a CPU core."""
MLP_SIZES = dict(d_in=8, d_hidden=64, d_out=4, depth=4)
"""The lesson's TinyMLP: five Linear layers, 13,316 parameters."""


@dataclass(frozen=True)
class Task:
    """A model kind, its data set, and the items of each step."""

    kind: str = "gpt"
    """``"gpt"`` (token prediction, cross-entropy) or ``"mlp"`` (regression, mean squared error)."""
    items: int = 4096
    """Training items; steps wrap around them."""
    eval_items: int = 512
    """Held-out items for the final loss."""
    seed: int = 0
    """Seed of the model's parameters and of the data."""

    def __post_init__(self) -> None:
        if self.kind not in ("gpt", "mlp"):
            raise ValueError(f"Task: kind must be 'gpt' or 'mlp', got {self.kind!r}")
        check_int("Task", "items", self.items)
        check_int("Task", "eval_items", self.eval_items)

    def model(self, device: torch.device | str | None = None) -> nn.Module:
        """A fresh model, the same values for the same seed on every rank."""
        if self.kind == "gpt":
            return TinyGPT(replace(GPT_CONFIG, seed=self.seed), device=device)
        return TinyMLP(**MLP_SIZES, seed=self.seed, device=device)

    def data(self, device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
        """All items, training then held out: (x, y) on ``device``."""
        n = self.items + self.eval_items
        if self.kind == "gpt":
            return make_token_data(n, GPT_CONFIG.seq_len, GPT_CONFIG.vocab_size,
                                   seed=self.seed + 1, device=device)
        return make_regression_data(n, MLP_SIZES["d_in"], MLP_SIZES["d_out"],
                                    seed=self.seed + 1, device=device)

    def loss(self, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        """The mean loss of ``model`` on the items (x, y)."""
        if self.kind == "gpt":
            return model(x, y)[1]
        return F.mse_loss(model(x), y)

    def batch(self, x: Tensor, y: Tensor, *, step: int, rank: int, world_size: int,
              batch: int) -> tuple[Tensor, Tensor]:
        """Rank ``rank``'s ``batch`` items at ``step`` (see the module docstring)."""
        start = (step * world_size + rank) * batch
        idx = torch.arange(start, start + batch, device=x.device) % self.items
        return x[idx], y[idx]

    def held_out(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """The held-out items."""
        return x[self.items:], y[self.items:]


@dataclass(frozen=True)
class TrainedRun:
    """What `train_recorded` returns for one rank."""

    losses: list[float]
    """Training loss per step (this rank's batch)."""
    sent: list[int]
    """Bytes this rank passed to collectives per step (`toolkit.comm`'s rule: its inputs)."""
    calls: list[int]
    """Collectives per step (all-reduces; all-gathers and all-to-alls where compression
    uses them)."""
    final: float
    """Loss of the final model on the held-out items."""
    equal: bool
    """Every rank ended with bitwise the same parameters."""


def train_recorded(task: Task, model: nn.Module, forward: nn.Module, opt: torch.optim.Optimizer,
                   x: Tensor, y: Tensor, *, steps: int, rank: int, world_size: int,
                   batch: int) -> TrainedRun:
    """``steps`` steps of ``opt`` on ``forward`` (``model`` or a DDP wrapper of it), rank r
    taking `Task.batch`'s items, each step's backward and ``opt.step()`` under
    `comm.recording()` (so a local-SGD optimizer's all-reduce counts too); then the held-out
    loss and an all-gather of the parameters, outside any recording. Call on every rank."""
    losses, sent, calls = [], [], []
    for step in range(steps):
        xb, yb = task.batch(x, y, step=step, rank=rank, world_size=world_size, batch=batch)
        opt.zero_grad()
        with comm.recording() as trace:
            loss = task.loss(forward, xb, yb)
            loss.backward()
            opt.step()
        collectives = [e for e in trace.events if e.kind == "collective"]
        sent.append(sum(e.nbytes for e in collectives))
        calls.append(len(collectives))
        losses.append(loss.item())
    with torch.no_grad():
        final = task.loss(model, *task.held_out(x, y)).item()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    copies = [torch.empty_like(flat) for _ in range(world_size)]
    dist.all_gather(copies, flat)
    return TrainedRun(losses=losses, sent=sent, calls=calls, final=final,
                      equal=all(torch.equal(c, copies[0]) for c in copies))


def mean_losses(per_rank: Sequence[TrainedRun]) -> list[float]:
    """The training loss per step, averaged over the ranks' runs."""
    return [sum(v) / len(per_rank) for v in zip(*(r.losses for r in per_rank))]
