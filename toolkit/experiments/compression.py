"""Compressed gradients against fp32 DDP on real ranks and the same data: QSGD, top-k with and
without error feedback, scaled sign, 1-bit Adam; and the harness of lesson 15's hook exercise.

Each `Squeeze` trains a fresh copy of a `Task`'s model on every rank for ``steps`` steps, rank
r taking the task's items for (step, r) (`toolkit.experiments.training`); the recorder counts
every collective a rank makes per step. Variants:

    method="none"     `BucketedDDP` (one bucket: the whole gradient), fp32 all-reduce
    method="qsgd" | "topk" | "sign"
                      the same DDP with `compression.compressed_hook` (all-gather of payloads)
    method="onebit"   no DDP: `OneBitAdam` averages the gradient itself (fp32 during warm-up,
                      then its 1-bit all-to-all + all-gather)
    optimizer         "sgd" (``momentum``, default 0: plain SGD, the setting of Stich et al.'s
                      analysis) or "adam" (with method="onebit", Adam's settings)

Bytes per step are exact and deterministic (`toolkit.cost.compression` predicts them); losses
depend on floating-point order and, for QSGD, on its seeded rounding.

`hook_trial` runs a DDP communication hook written in a lesson (the top-k exercise) on TinyMLP
and returns, per call, what a judge needs: the gradient, the memory before and after, the
averaged result and the bytes and collectives the call made. `judge_topk_trial` judges it by
plain arithmetic (sums, comparisons, a byte count), never against a top-k written out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from .. import comm
from ..arguments import check_int, check_positive
from ..cost.compression import topk_bytes
from ..data_parallel.compression import CompressionState, compressed_hook
from ..data_parallel.ddp import BucketedDDP
from ..data_parallel.onebit_adam import OneBitAdam
from ..launch import device, spawn
from .training import Task, TrainedRun, mean_losses, train_recorded

__all__ = ["Squeeze", "SqueezeRun", "TopKState", "compare", "hook_trial", "judge_topk_trial",
           "trial_of"]

METHODS = ("none", "qsgd", "topk", "sign", "onebit")


@dataclass(frozen=True)
class Squeeze:
    """One way to exchange gradients, and the optimizer around it."""

    name: str
    method: str = "none"
    """One of ``none``, ``qsgd``, ``topk``, ``sign``, ``onebit``."""
    optimizer: str = "sgd"
    """``"sgd"`` or ``"adam"``; ``onebit`` is Adam."""
    lr: float = 0.05
    momentum: float = 0.0
    """SGD's momentum."""
    density: float = 0.01
    """top-k: fraction of entries sent."""
    levels: int = 4
    """QSGD: s."""
    block: int = 256
    """QSGD: d."""
    error_feedback: bool = True
    warmup_steps: int = 16
    """1-bit Adam: T_w, Adam steps on the fp32 all-reduce before freezing v."""
    scale_block: int | None = None
    """1-bit Adam: elements per scale (None: one per chunk, as the paper)."""

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"Squeeze {self.name!r}: method must be one of {METHODS}, "
                             f"got {self.method!r}")
        if self.optimizer not in ("sgd", "adam"):
            raise ValueError(f"Squeeze {self.name!r}: optimizer must be 'sgd' or 'adam', "
                             f"got {self.optimizer!r}")
        check_positive(f"Squeeze {self.name!r}", "lr", self.lr)

    def state(self) -> CompressionState:
        return CompressionState(method=self.method, density=self.density, levels=self.levels,
                                block=self.block, error_feedback=self.error_feedback)


@dataclass
class SqueezeRun:
    """Losses and recorded bytes of one variant."""

    variant: Squeeze
    losses: list[float]
    """Training loss per step, mean over ranks."""
    bytes_per_step: list[int]
    """Rank 0's bytes passed to collectives at each step."""
    calls_per_step: list[int]
    """Rank 0's collectives at each step."""
    final_loss: float
    """Held-out loss of rank 0's final model."""
    replicas_equal: bool
    numel: int = 0
    """Ψ, the gradient's elements."""


def _train(rank: int, world_size: int, task: Task, variants: list[Squeeze], steps: int,
           batch: int) -> list[TrainedRun]:
    dev = device()
    x, y = task.data(dev)
    out = []
    for v in variants:
        model = task.model(dev)
        params = list(model.parameters())
        if v.method == "onebit":
            forward: torch.nn.Module = model
            opt: torch.optim.Optimizer = OneBitAdam(params, lr=v.lr, block=v.scale_block,
                                                    warmup_steps=v.warmup_steps)
        else:
            forward = BucketedDDP(model, bucket_cap_mb=64.0)     # one bucket: Ψ elements
            if v.method != "none":
                forward.register_comm_hook(v.state(), compressed_hook)
            opt = (torch.optim.SGD(params, lr=v.lr, momentum=v.momentum) if v.optimizer == "sgd"
                   else torch.optim.Adam(params, lr=v.lr, foreach=True))
        out.append(train_recorded(task, model, forward, opt, x, y, steps=steps, rank=rank,
                                  world_size=world_size, batch=batch))
    return out


def compare(variants: Sequence[Squeeze], *, task: Task | None = None, world_size: int = 2,
            steps: int = 64, batch: int = 8, timeout: float = 120) -> list[SqueezeRun]:
    """Train every variant on ``world_size`` ranks (one launch); return their `SqueezeRun`s."""
    check_int("compare", "world_size", world_size)
    check_int("compare", "steps", steps)
    check_int("compare", "batch", batch)
    if not variants:
        raise ValueError("compare: variants is empty; pass at least one Squeeze")
    task = task or Task("mlp")
    results = spawn(_train, world_size, task, list(variants), steps, batch, timeout=timeout,
                    echo=False)
    numel = sum(p.numel() for p in task.model().parameters())
    return [SqueezeRun(variant=v, losses=mean_losses([r[i] for r in results]),
                       bytes_per_step=results[0][i].sent, calls_per_step=results[0][i].calls,
                       final_loss=results[0][i].final, replicas_equal=results[0][i].equal,
                       numel=numel)
            for i, v in enumerate(variants)]


@dataclass
class TopKState:
    """The state a top-k hook gets: how many entries to send, and its memory per bucket."""

    k: int
    """Entries each rank sends per bucket."""
    residual: dict = field(default_factory=dict)
    """Bucket index → what was left out so far (absent before the first call)."""


def hook_trial(rank: int, world_size: int, hook: Callable[[Any, Any], Any], k: int,
               steps: int, lr: float = 0.05) -> list[dict]:
    """Rank function: ``steps`` SGD steps of TinyMLP under `BucketedDDP` (one bucket) with
    ``hook`` registered on a `TopKState`; per call, a dict of the gradient before the hook, the
    memory before and after, the averaged gradient, and the ops and bytes the call recorded."""
    task = Task("mlp")
    dev = device()
    x, y = task.data(dev)
    model = task.model(dev)
    ddp = BucketedDDP(model, bucket_cap_mb=64.0)
    calls: list[dict] = []

    def watched(state: TopKState, bucket: Any) -> Any:
        key = bucket.index()
        grad = bucket.buffer().clone()
        before = state.residual.get(key)
        before = torch.zeros_like(grad) if before is None else before.clone()
        with comm.recording() as trace:
            fut = hook(state, bucket)
            result = fut.wait().clone()
        after = state.residual.get(key)
        calls.append(dict(grad=grad.cpu(), before=before.cpu(),
                          after=None if after is None else after.detach().cpu().clone(),
                          result=result.cpu(), ops=[e.op for e in trace.events],
                          nbytes=sum(e.nbytes for e in trace.events)))
        return fut

    ddp.register_comm_hook(TopKState(k=k), watched)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for step in range(steps):
        xb, yb = task.batch(x, y, step=step, rank=rank, world_size=world_size, batch=8)
        opt.zero_grad()
        task.loss(ddp, xb, yb).backward()
        opt.step()
    return calls


def trial_of(hook: Callable[[Any, Any], Any], *, k: int, steps: int) -> Callable[[int, int], list]:
    """`hook_trial` of ``hook`` as a rank function ``fn(rank, world_size)`` that bears the hook's
    name, so that `toolkit.exercises.attempt` names the function a student has to fill in."""
    def run(rank: int, world_size: int) -> list[dict]:
        return hook_trial(rank, world_size, hook, k, steps)
    run.__name__ = getattr(hook, "__name__", "hook")
    return run


def judge_topk_trial(per_rank: Sequence[Sequence[dict]], k: int) -> list[tuple[str, str]]:
    """What is wrong with a top-k hook with error feedback, from `hook_trial`'s records of
    every rank: (problem, hint) pairs, empty when every call of every rank is right. Checked per
    call: the memory carried over from the last call; a = gradient + memory before, and the
    entries sent (where the memory after differs from a) are k, the largest |a|, with memory
    0 there (memory after + sent = a, exactly); the result is the mean over ranks of what each
    sent, the same on every rank; the bytes passed to collectives are 8k (k fp32 values and k
    int32 indices)."""
    problems: list[tuple[str, str]] = []
    world = len(per_rank)
    for step in range(min(len(calls) for calls in per_rank)):
        sent = []
        for rank in range(world):
            call, where = per_rank[rank][step], f"rank {rank}, call {step + 1}"
            if call["after"] is None:
                problems.append((f"{where}: state.residual holds no memory for the bucket after "
                                 "the call", "keep the memory under the bucket's index()"))
                return problems
            if step and not torch.equal(call["before"], per_rank[rank][step - 1]["after"]):
                problems.append((f"{where}: the memory the call started from is not the one the "
                                 "previous call left", "read the memory back before replacing it"))
            meant = call["grad"] + call["before"]
            mask = call["after"] != meant
            if int(mask.sum()) != k:
                problems.append((f"{where}: {int(mask.sum())} nonzero entries were sent (left "
                                 f"the memory), not k = {k}",
                                 "send the k entries of gradient + memory largest in magnitude; "
                                 "what was sent leaves the memory, the rest stays"))
            elif (call["after"][mask] != 0).any():
                problems.append((f"{where}: entries that were sent did not leave the memory "
                                 "empty", "memory after = what you meant − what you sent"))
            elif meant[mask].abs().min() < meant[~mask].abs().max():
                problems.append((f"{where}: an entry was sent while a larger one (in magnitude) "
                                 "was kept", "rank the entries of gradient + memory by |value|"))
            if call["nbytes"] != topk_bytes(k):
                problems.append((f"{where}: the call passed {call['nbytes']:,} bytes to "
                                 f"{call['ops']}, not {topk_bytes(k):,}",
                                 "k fp32 values and k int32 indices per rank, nothing more"))
            sent.append(meant - call["after"])
        mean = sum(sent) / world
        for rank in range(world):
            if not torch.allclose(per_rank[rank][step]["result"], mean, atol=1e-6):
                problems.append((f"rank {rank}, call {step + 1}: the returned gradient is not the "
                                 "mean over ranks of what each sent",
                                 "every rank adds every rank's entries, then divides by p"))
        if problems:
            return problems
    return problems
