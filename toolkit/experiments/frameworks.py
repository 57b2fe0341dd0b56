"""PyTorch Lightning beside the course's own DDP and FSDP: same ranks, model, data and optimizer.

Two runs of SGD that start from the same parameters, see the same samples in the same order and
average gradients over the same ranks take the same steps. With 2 ranks they are even equal bit
for bit: halving is exact in binary floating point and a + b = b + a, so the order in which
torch's C++ reducer, FSDP2 and the course's code divide and add does not matter. Where runs
differ, one of those inputs differs, and lesson 16 names it.

Runs (`RUNS`) on 2 gloo CPU ranks, recorded by `toolkit.comm` and by the bytes each process
wrote to the kernel (`toolkit.comm.kernel_io.written_bytes`). Who starts the processes decides
where the recorder is installed (Lightning 2.6, `pytorch_lightning/strategies/launchers/`):

=====================  ========================================================================
run                    what trains, and who starts the ranks
=====================  ========================================================================
lightning_ddp          ``Trainer(strategy="ddp_notebook")``: Lightning forks the caller (the
                       only DDP launcher a notebook can use); `RecorderCallback` records
lightning_ddp_log      the same, logging the loss with ``self.log(sync_dist=True)``
lightning_ddp_ckpt     the same, with Lightning's ModelCheckpoint (rank 0 writes, every epoch)
lightning_ddp_ranks    ``Trainer(strategy="ddp")`` in ranks `spawn` started (``LOCAL_RANK`` set:
                       Lightning starts nothing); refused where the caller is a notebook kernel,
                       whose forks inherit Lightning's "interactive" flag
lightning_fsdp         ``ModelParallelStrategy(data_parallel_size=p, tensor_parallel_size=1)`` in
                       ranks `spawn` started: FSDP2's ``fully_shard`` on the course's units
lightning_fsdp_auto    ``ModelParallelStrategy()`` with its defaults: on one node the data-
                       parallel size is the node count, 1: no sharding, no sync, no data split
course_ddp             `OverlappedDDP`, samples dealt by `shard_indices` (Lightning's sampler)
course_ddp_split       `OverlappedDDP`, rank r takes the r-th contiguous slice (lesson 04)
course_fsdp            `FullyShardedDataParallel`, samples by `shard_indices`
=====================  ========================================================================

`compare(runs)` trains them (those in ranks in one launch); `fit_launched(strategy)` is one run
on processes Lightning forks itself. Lightning's other launchers (``"ddp"`` runs the script
again, ``"ddp_spawn"`` starts fresh interpreters) are left out: seconds of imports per rank, and
``"ddp"`` cannot start from a notebook (lesson 16, section 2).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import pandas as pd
import pytorch_lightning as pl
import torch
import torch.distributed as dist
from pytorch_lightning.strategies import ModelParallelStrategy
from torch.distributed.tensor import DTensor

from .. import comm
from ..arguments import check_int
from ..chunks import chunk_bounds
from ..cost import bytes_sent_per_rank
from ..data_parallel.ddp import OverlappedDDP
from ..data_parallel.fsdp import FullyShardedDataParallel
from ..data_parallel.fsdp_schedule import ring_wire_bytes
from ..data_parallel.sampler import shard_indices
from ..comm.kernel_io import written_bytes
from ..frameworks import CourseModule, RecorderCallback, course_loss, quiet, read_recorded
from ..launch import device, spawn
from .train_config import TrainConfig, max_param_diff

LAUNCHED = {"lightning_ddp": {}, "lightning_ddp_log": {"sync_log": True},
            "lightning_ddp_ckpt": {"checkpoint": True}}
"""Runs on processes Lightning starts ("ddp_notebook"), and their options."""
IN_RANKS = ("lightning_ddp_ranks", "lightning_fsdp", "lightning_fsdp_auto", "course_ddp",
            "course_ddp_split", "course_fsdp")
"""Runs in ranks `spawn` starts, one launch for all."""
RUNS = tuple(LAUNCHED) + IN_RANKS
DEFAULT_CONFIG = TrainConfig()
"""What `compare` and `fit_launched` train unless told otherwise."""


@dataclass
class RunResult:
    """One run on every rank."""

    name: str
    losses: list[list[float]]
    """[rank][step]: each rank's loss on its batch, before the step."""
    seen: list[list[list[int]]]
    """[rank][step]: the sample indices of each rank's batch."""
    params: list[dict[str, torch.Tensor]]
    """[rank]: the full parameters after training (gathered for the sharded runs)."""
    events: list[comm.Event] = field(repr=False)
    """What the recorder saw on every rank while training, in time order."""
    written: list[int | None] = field(default_factory=list)
    """[rank]: bytes the rank's process wrote to the kernel while training (None: no /proc)."""
    files: list[str] = field(default_factory=list)
    """Checkpoint files the run left (Lightning's ModelCheckpoint), relative to its folder."""

    def max_param_diff(self, other: "RunResult") -> float:
        """Largest |difference| between rank 0's final parameters here and in `other`."""
        return max_param_diff(self.params[0], other.params[0], names=(self.name, other.name))

    def max_loss_diff(self, other: "RunResult") -> float:
        """Largest |difference| between the per-step losses of the two runs, any rank (inf
        when they took different numbers of steps)."""
        if [len(r) for r in self.losses] != [len(r) for r in other.losses]:
            return float("inf")
        return max((abs(a - b) for mine, theirs in zip(self.losses, other.losses)
                    for a, b in zip(mine, theirs)), default=0.0)


def _trainer(strategy: Any, config: TrainConfig, world_size: int, root: str, *,
             checkpoint: bool = False, callbacks: Sequence[pl.Callback] = ()) -> pl.Trainer:
    return pl.Trainer(strategy=strategy, accelerator="cpu", devices=world_size, num_nodes=1,
                      max_epochs=config.epochs, logger=False, enable_checkpointing=checkpoint,
                      enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=root, callbacks=list(callbacks))


def _checkpoints(root: str) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in Path(root).rglob("*.ckpt"))


FORK_LAUNCHED = ("ddp_notebook", "ddp_fork")
"""Lightning's strategies whose launcher forks the caller (`fit_launched`)."""


def fit_launched(strategy: str = "ddp_notebook", *, config: TrainConfig = DEFAULT_CONFIG,
                 world_size: int = 2, folder: str | None = None, sync_log: bool = False,
                 checkpoint: bool = False) -> RunResult:
    """Let Lightning fork `world_size` processes from this one (`FORK_LAUNCHED`) and train on
    them; `RecorderCallback` brings back what each rank's recorder saw and its parameters.
    `folder` keeps the ranks' records and checkpoints (default: a temporary folder, removed)."""
    if strategy not in FORK_LAUNCHED:
        raise ValueError(f"fit_launched: strategy must be one of {FORK_LAUNCHED} (Lightning forks "
                         f"this process), got {strategy!r}; for ranks you start, use compare()")
    check_int("fit_launched", "world_size", world_size)
    own = folder is None
    folder = tempfile.mkdtemp(prefix="lightning-launched-") if own else folder
    try:
        module = CourseModule(config.build_model(), lr=config.lr, sync_log=sync_log)
        with quiet():
            trainer = _trainer(strategy, config, world_size, folder, checkpoint=checkpoint,
                               callbacks=[RecorderCallback(folder, threads=1)])
            trainer.fit(module, config.loader())
        records, files = read_recorded(folder, world_size), _checkpoints(folder)
    finally:
        if own:
            shutil.rmtree(folder, ignore_errors=True)
    events = sorted((e for r in records for e in r.events), key=lambda e: (e.start, e.rank, e.seq))
    return RunResult(strategy, [r.step_losses for r in records], [r.seen for r in records],
                     [r.params for r in records], events, [r.written for r in records], files)


def _full_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter in full (a DTensor gathered: a collective), by name, on the CPU."""
    return {name: (p.full_tensor() if isinstance(p, DTensor) else p).detach().to("cpu").clone()
            for name, p in model.named_parameters()}


def _lightning(run: str, config: TrainConfig, world_size: int, root: str) -> dict:
    strategy: Any = "ddp"
    if run == "lightning_fsdp":
        strategy = ModelParallelStrategy(data_parallel_size=world_size, tensor_parallel_size=1)
    elif run == "lightning_fsdp_auto":
        strategy = ModelParallelStrategy()
    module = CourseModule(config.build_model(), lr=config.lr)
    with quiet(), comm.recording() as trace:
        trainer = _trainer(strategy, config, world_size, root)
        start = written_bytes()
        trainer.fit(module, config.loader())
        end = written_bytes()
    return dict(losses=module.step_losses, seen=module.seen, events=trace.events,
                written=None if start is None else end - start,
                params=_full_params(module.model))


def _course(run: str, config: TrainConfig, rank: int, world_size: int) -> dict:
    dev = device()
    _, x, y = config.dataset().tensors
    x, y = x.to(dev), y.to(dev)
    model = config.build_model(dev)
    names = [n for n, _ in model.named_parameters()]  # FSDP replaces them by flat shards
    losses, seen = [], []
    with comm.recording() as trace:  # wrapping included: DDP broadcasts rank 0's parameters
        start = written_bytes()
        wrapped = FullyShardedDataParallel(model) if run == "course_fsdp" else OverlappedDDP(model)
        opt = torch.optim.SGD(wrapped.parameters(), lr=config.lr)
        for epoch in range(config.epochs):
            if run == "course_ddp_split":
                lo, hi = chunk_bounds(config.samples, world_size)[rank]
                order = list(range(lo, hi))
            else:
                order = shard_indices(config.samples, rank=rank, world_size=world_size,
                                      epoch=epoch)
            for batch in torch.tensor(order, device=dev).split(config.batch_size):
                opt.zero_grad()
                loss = course_loss(wrapped, x[batch], y[batch])
                loss.backward()
                opt.step()
                losses.append(loss.item())
                seen.append(batch.tolist())
        end = written_bytes()
    params = wrapped.full_state_dict() if run == "course_fsdp" else dict(model.named_parameters())
    return dict(losses=losses, seen=seen, events=trace.events,
                written=None if start is None else end - start,
                params={n: params[n].detach().to("cpu").clone() for n in names})


def _rank(rank: int, world_size: int, runs: Sequence[str], config: TrainConfig,
          root: str) -> dict[str, dict]:
    out = {}
    for run in runs:
        dist.barrier()  # runs start together; outside every recording
        if run.startswith("lightning"):
            out[run] = _lightning(run, config, world_size, os.path.join(root, run))
        else:
            out[run] = _course(run, config, rank, world_size)
    return out


def compare(runs: Sequence[str] = RUNS, *, config: TrainConfig = DEFAULT_CONFIG,
            world_size: int = 2, timeout: float = 120) -> dict[str, RunResult]:
    """Train every run in `runs` on `world_size` gloo ranks (module docstring); run name ->
    `RunResult`, in the order of `runs`."""
    unknown = [r for r in runs if r not in RUNS]
    if unknown:
        raise ValueError(f"compare: unknown runs {unknown}; choose from {RUNS}")
    check_int("compare", "world_size", world_size)
    results = {run: fit_launched("ddp_notebook", config=config, world_size=world_size,
                                 **LAUNCHED[run]) for run in runs if run in LAUNCHED}
    in_ranks = [run for run in runs if run in IN_RANKS]
    if in_ranks:
        root = tempfile.mkdtemp(prefix="lightning-runs-")
        try:  # PL_GLOBAL_SEED would change Lightning's sampler seed: 0, as shard_indices'
            per_rank = spawn(_rank, world_size, in_ranks, config, root, backend="gloo",
                             timeout=timeout, echo=False, env={"PL_GLOBAL_SEED": "0"})
        finally:
            shutil.rmtree(root, ignore_errors=True)
        for run in in_ranks:
            ranks = [r[run] for r in per_rank]
            events = sorted((e for r in ranks for e in r["events"]),
                            key=lambda e: (e.start, e.rank, e.seq))
            results[run] = RunResult(run, [r["losses"] for r in ranks],
                                     [r["seen"] for r in ranks], [r["params"] for r in ranks],
                                     events, [r["written"] for r in ranks])
    return {run: results[run] for run in runs}


def wire_bytes(events: Sequence[comm.Event], *, rank: int, world_size: int) -> float:
    """Bytes rank `rank` puts on the wire for the recorded `events`, by lesson 02's formulas: a
    ring for all-reduce, all-gather and reduce-scatter (`ring_wire_bytes`), the root sending to
    every other rank for a broadcast. Calls the recorder did not see count 0."""
    total = 0.0
    for e in events:
        if e.rank == rank and e.op == "broadcast" and e.peer == rank:
            total += bytes_sent_per_rank("broadcast", "linear", e.nbytes, world_size)
        elif e.rank == rank:
            total += ring_wire_bytes(e.op, e.nbytes, world_size)
    return total


def traffic_table(results: dict[str, RunResult], *, rank: int = 0,
                  world_size: int = 2) -> pd.DataFrame:
    """Per run, rank `rank`'s recorded calls per op and bytes (what the rank passed in), the
    bytes those calls put on the wire (`wire_bytes`), and the bytes its process wrote."""
    rows = []
    for name, res in results.items():
        mine = [e for e in res.events if e.rank == rank]
        row: dict[str, Any] = {
            "run": name, "recorded calls": len(mine), "recorded bytes": sum(e.nbytes for e in mine),
            "wire bytes of recorded calls": wire_bytes(mine, rank=rank, world_size=world_size),
            "written bytes": res.written[rank]}
        for e in mine:
            row[f"{e.op} calls"] = row.get(f"{e.op} calls", 0) + 1
        rows.append(row)
    return pd.DataFrame(rows).set_index("run").fillna(0)


__all__ = ["FORK_LAUNCHED", "IN_RANKS", "LAUNCHED", "RUNS", "RunResult", "TrainConfig",
           "compare", "fit_launched", "traffic_table", "wire_bytes"]
