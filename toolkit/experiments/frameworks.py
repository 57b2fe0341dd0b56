"""PyTorch Lightning beside the course's own DDP and FSDP: same ranks, model, data and optimizer.

Two runs of SGD that start from the same parameters, see the same samples in the same order and
average gradients over the same ranks take the same steps. With 2 ranks they are even equal bit
for bit: halving is exact in binary floating point and a + b = b + a, so the order in which
torch's C++ reducer, FSDP2 and the course's code divide and add does not matter. Where runs
differ, one of those three inputs differs, and the comparison names it (lesson 16).

Runs (`RUNS`), each trained on every rank of one `spawn` (gloo, CPU), recorded by `toolkit.comm`
and by the bytes each process wrote to the kernel (`toolkit.frameworks.written_bytes`):

===================  ==========================================================================
run                  what trains
===================  ==========================================================================
lightning_ddp        ``Trainer(strategy="ddp")``: torch's DistributedDataParallel
lightning_ddp_log    the same, logging the loss with ``self.log(sync_dist=True)``
lightning_ddp_ckpt   the same, with Lightning's ModelCheckpoint (rank 0 writes, every epoch)
lightning_fsdp       ``ModelParallelStrategy(data_parallel_size=p, tensor_parallel_size=1)``:
                     FSDP2's ``fully_shard`` on the course's units (`frameworks.shard_units`)
lightning_fsdp_auto  ``ModelParallelStrategy()`` with its defaults: on one node the data-parallel
                     size is the node count, 1: no sharding, no gradient sync, no data split
course_ddp           `OverlappedDDP`, samples dealt by `shard_indices` (Lightning's sampler)
course_ddp_split     `OverlappedDDP`, rank r takes the r-th contiguous slice every epoch (lesson 04)
course_fsdp          `FullyShardedDataParallel`, samples by `shard_indices`
===================  ==========================================================================

`compare(runs)` runs them in one launch (Lightning inside ranks the course started: it sees
``LOCAL_RANK`` and starts no process). `fit_launched(strategy)` lets Lightning start the
processes itself (``"ddp_notebook"`` forks the caller; ``"ddp"`` runs the script again) with
`RecorderCallback` bringing back what each rank's recorder saw. ``python -m
toolkit.experiments.frameworks OUT`` is that script (``strategy="ddp"``), for a test.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
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
from torch.utils.data import DataLoader, TensorDataset

from .. import comm
from ..arguments import check_int, check_positive
from ..chunks import chunk_bounds
from ..data_parallel.ddp import OverlappedDDP
from ..data_parallel.fsdp import FullyShardedDataParallel
from ..data_parallel.sampler import shard_indices
from ..frameworks import (CourseModule, RecorderCallback, course_loss, quiet, read_recorded,
                          written_bytes)
from ..launch import device, spawn
from ..models import GPTConfig, TinyGPT, TinyMLP, make_regression_data, make_token_data

RUNS = ("lightning_ddp", "lightning_ddp_log", "lightning_ddp_ckpt", "lightning_fsdp",
        "lightning_fsdp_auto",
        "course_ddp", "course_ddp_split", "course_fsdp")
"""Every run `compare` knows (module docstring)."""


@dataclass(frozen=True)
class TrainConfig:
    """What every run trains: the same model, data, batches and optimizer."""

    model: str = "gpt"
    """``"gpt"`` (TinyGPT on `make_token_data`) or ``"mlp"`` (TinyMLP on regression data)."""
    gpt: GPTConfig = GPTConfig()
    """The TinyGPT's sizes (its ``seed`` initialises every rank alike)."""
    samples: int = 64
    """Samples in the data set; each epoch deals them out over the ranks."""
    batch_size: int = 8
    """Samples per rank per step."""
    epochs: int = 2
    lr: float = 0.5
    """Plain SGD's learning rate."""
    sampler_seed: int = 0
    """Seed of the shuffling sampler (Lightning's default, 0, is read from PL_GLOBAL_SEED)."""

    def __post_init__(self) -> None:
        if self.model not in ("gpt", "mlp"):
            raise ValueError(f"TrainConfig: model must be 'gpt' or 'mlp', got {self.model!r}")
        for name in ("samples", "batch_size", "epochs"):
            check_int("TrainConfig", name, getattr(self, name))
        check_int("TrainConfig", "sampler_seed", self.sampler_seed, low=0)
        check_positive("TrainConfig", "lr", self.lr)

    def build_model(self, device: torch.device | None = None) -> torch.nn.Module:
        """The model every run starts from, the same on every rank, on `device`."""
        if self.model == "gpt":
            return TinyGPT(self.gpt, device=device)
        return TinyMLP(seed=0, device=device)

    def dataset(self) -> TensorDataset:
        """(index, x, y) for every sample, on the CPU, the same on every rank."""
        if self.model == "gpt":
            x, y = make_token_data(self.samples, self.gpt.seq_len, self.gpt.vocab_size)
        else:
            x, y = make_regression_data(self.samples, 8, 4)
        return TensorDataset(torch.arange(self.samples), x, y)


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
    """Checkpoint files the run left, relative to its folder (Lightning's ModelCheckpoint)."""

    def max_param_diff(self, other: "RunResult") -> float:
        """Largest |difference| between rank 0's final parameters here and in `other`."""
        a, b = self.params[0], other.params[0]
        if a.keys() != b.keys():
            raise ValueError(f"max_param_diff: {self.name} and {other.name} name their "
                             f"parameters differently: {sorted(a.keys() ^ b.keys())}")
        return max((a[k] - b[k]).abs().max().item() for k in a)

    def max_loss_diff(self, other: "RunResult") -> float:
        """Largest |difference| between the per-step losses of the two runs, any rank."""
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


def _full_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter in full (a DTensor gathered: a collective), by name, on the CPU."""
    out = {}
    for name, p in model.named_parameters():
        value = p.full_tensor() if isinstance(p, DTensor) else p
        out[name] = value.detach().to("cpu").clone()
    return out


def _lightning(run: str, config: TrainConfig, world_size: int, root: str) -> dict:
    strategy: Any = "ddp"
    if run == "lightning_fsdp":
        strategy = ModelParallelStrategy(data_parallel_size=world_size, tensor_parallel_size=1)
    elif run == "lightning_fsdp_auto":
        strategy = ModelParallelStrategy()
    module = CourseModule(config.build_model(), lr=config.lr, sync_log=run == "lightning_ddp_log")
    loader = DataLoader(config.dataset(), batch_size=config.batch_size)
    with quiet(), comm.recording() as trace:
        trainer = _trainer(strategy, config, world_size, os.path.join(root, run),
                           checkpoint=run == "lightning_ddp_ckpt")
        start = written_bytes()
        trainer.fit(module, loader)
        end = written_bytes()
    files = sorted(str(p.relative_to(root)) for p in Path(root, run).rglob("*.ckpt"))
    return dict(losses=module.step_losses, seen=module.seen, events=trace.events,
                written=None if start is None else end - start,
                params=_full_params(module.model), files=files)


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
                                      epoch=epoch, seed=config.sampler_seed)
            for batch in torch.tensor(order, device=dev).split(config.batch_size):
                opt.zero_grad()
                loss = course_loss(wrapped, x[batch], y[batch])
                loss.backward()
                opt.step()
                losses.append(loss.item())
                seen.append(batch.tolist())
        end = written_bytes()
    params = wrapped.full_state_dict() if run == "course_fsdp" else dict(model.named_parameters())
    return dict(losses=losses, seen=seen, events=trace.events, files=[],
                written=None if start is None else end - start,
                params={n: params[n].detach().to("cpu").clone() for n in names})


def _rank(rank: int, world_size: int, runs: Sequence[str], config: TrainConfig,
          root: str) -> dict[str, dict]:
    out = {}
    for run in runs:
        dist.barrier()  # runs start together; not recorded (outside any recording)
        if run.startswith("lightning"):
            out[run] = _lightning(run, config, world_size, root)
        else:
            out[run] = _course(run, config, rank, world_size)
    return out


def compare(runs: Sequence[str] = RUNS, *, config: TrainConfig = TrainConfig(),
            world_size: int = 2, timeout: float = 120) -> dict[str, RunResult]:
    """Train every run in `runs` on `world_size` gloo ranks of one launch (module docstring);
    run name -> `RunResult`."""
    unknown = [r for r in runs if r not in RUNS]
    if unknown:
        raise ValueError(f"compare: unknown runs {unknown}; choose from {RUNS}")
    check_int("compare", "world_size", world_size)
    root = tempfile.mkdtemp(prefix="lightning-runs-")
    try:
        # PL_GLOBAL_SEED seeds Lightning's sampler: set it, so a seed_everything() call in the
        # caller cannot make Lightning deal other samples than the course's runs.
        per_rank = spawn(_rank, world_size, list(runs), config, root, backend="gloo",
                         timeout=timeout, echo=False,
                         env={"PL_GLOBAL_SEED": str(config.sampler_seed)})
    finally:
        shutil.rmtree(root, ignore_errors=True)
    results = {}
    for run in runs:
        ranks = [r[run] for r in per_rank]
        events = sorted((e for r in ranks for e in r["events"]),
                        key=lambda e: (e.start, e.rank, e.seq))
        results[run] = RunResult(run, [r["losses"] for r in ranks], [r["seen"] for r in ranks],
                                 [r["params"] for r in ranks], events,
                                 [r["written"] for r in ranks], ranks[0].get("files", []))
    return results


def traffic_table(results: dict[str, RunResult], *, rank: int = 0) -> pd.DataFrame:
    """Per run, what rank `rank` did: calls and bytes the recorder saw per op (bytes as the
    recorder counts them: what the rank passed in), and bytes its process wrote."""
    rows = []
    for name, res in results.items():
        mine = [e for e in res.events if e.rank == rank]
        row: dict[str, Any] = {"run": name, "recorded calls": len(mine),
                               "recorded bytes": sum(e.nbytes for e in mine),
                               "written bytes": res.written[rank]}
        for e in mine:
            row[f"{e.op} calls"] = row.get(f"{e.op} calls", 0) + 1
        rows.append(row)
    return pd.DataFrame(rows).set_index("run").fillna(0)


def fit_launched(strategy: str = "ddp_notebook", *, config: TrainConfig = TrainConfig(),
                 world_size: int = 2, folder: str | None = None) -> RunResult:
    """Let Lightning start `world_size` processes itself (``"ddp_notebook"``/``"ddp_fork"``:
    forks of this process; ``"ddp"``: this script run again; ``"ddp_spawn"``: fresh
    interpreters) and train on them; what each rank's recorder saw comes back through
    `RecorderCallback` files. Rank 0's final parameters are this process's copy (Lightning
    sends them back to the caller, or this process *is* rank 0)."""
    check_int("fit_launched", "world_size", world_size)
    own = folder is None
    folder = tempfile.mkdtemp(prefix="lightning-launched-") if own else folder
    try:
        module = CourseModule(config.build_model(), lr=config.lr)
        loader = DataLoader(config.dataset(), batch_size=config.batch_size)
        with quiet():
            trainer = _trainer(strategy, config, world_size, folder,
                               callbacks=[RecorderCallback(folder, threads=1)])
            trainer.fit(module, loader)
        for proc in getattr(trainer.strategy.launcher, "procs", []):
            if isinstance(proc, subprocess.Popen):  # "ddp": the script's other ranks
                proc.wait()
        if trainer.global_rank != 0:  # the script run again: only rank 0 goes on
            return RunResult(strategy, [], [], [], [])
        records = read_recorded(folder, world_size)
    finally:
        if own:
            shutil.rmtree(folder, ignore_errors=True)
    events = sorted((e for r in records for e in r.events), key=lambda e: (e.start, e.rank, e.seq))
    params = {n: p.detach().clone() for n, p in module.model.named_parameters()}
    return RunResult(strategy, [r.step_losses for r in records], [r.seen for r in records],
                     [params], events, [r.written for r in records])


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m toolkit.experiments.frameworks OUT``: train with ``strategy="ddp"`` (Lightning
    runs this command again for rank 1) and write rank 0's view to OUT/summary.json."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("out", help="folder for summary.json (and the ranks' records)")
    parser.add_argument("--strategy", default="ddp")
    args = parser.parse_args(argv)
    result = fit_launched(args.strategy, folder=args.out)
    if int(os.environ.get("LOCAL_RANK", 0)) == 0:
        summary = {"losses": result.losses, "written": result.written,
                   "ops": [[e.rank, e.op, e.nbytes] for e in result.events]}
        with open(os.path.join(args.out, "summary.json"), "w") as f:
            json.dump(summary, f)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["RUNS", "RunResult", "TrainConfig", "compare", "fit_launched", "main",
           "traffic_table"]
