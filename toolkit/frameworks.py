"""The course's models inside PyTorch Lightning, and the course's recorder inside its processes.

A framework runs the algorithms of lessons 04 and 08, not new ones: data parallelism averages
gradients over ranks (Li et al., "PyTorch Distributed", VLDB 2020, §3; Lightning wraps the
module in torch's `DistributedDataParallel`), FSDP gathers each unit before use and
reduce-scatters its gradient (ZeRO-3: Rajbhandari et al., SC 2020, §5.3; Zhao et al., "PyTorch
FSDP", VLDB 2023, §3; Lightning's `ModelParallelStrategy` calls torch's FSDP2 ``fully_shard`` in
``configure_model``). What it adds is the machinery around them, listed in `RESPONSIBILITIES`
with the course's own code for each, as found in the Lightning 2.6 source.

- `CourseModule(model, lr=...)`: a `TinyGPT` or `TinyMLP` as a LightningModule. A batch is
  ``(index (b,), x, y)``: ``x, y`` as the model takes them (tokens ``(b, s)`` for TinyGPT,
  features ``(b, d_in)`` and targets ``(b, d_out)`` for TinyMLP); ``index`` says which samples
  the framework's sampler dealt this rank, kept in ``seen`` beside ``step_losses``.
- `RecorderCallback(folder)`: in each process Lightning runs a rank in (its own launchers start
  them; tested with ``"ddp_notebook"``'s forks, the launcher a notebook can use), installs
  `toolkit.comm`'s recorder in the ``setup`` hook, records until ``teardown``, and writes what
  it saw to ``folder/rank{r}.pkl``; `read_recorded(folder)` reads them back in the parent.
  The process group exists before any hook runs, so the calls Lightning makes while creating it
  are not seen.
- `shard_units`: the FSDP2 units the course's own runs use too; `course_loss` (from
  `toolkit.models`, re-exported) is the loss of every run.

This module imports Lightning; no other toolkit module imports it except
`toolkit.experiments.frameworks`, so no other lesson pays for Lightning's import.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytorch_lightning as pl
import torch
from torch import Tensor, nn
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from . import comm
from .arguments import check_int, check_positive
from .comm import Event
from .comm.kernel_io import written_bytes
from .data_parallel.units import default_units
from .models import course_loss

__all__ = ["RESPONSIBILITIES", "CourseModule", "RankRecord", "RecorderCallback",
           "Responsibility", "course_loss", "quiet", "read_recorded", "shard_units"]

LIGHTNING_LOGGERS = ("pytorch_lightning", "lightning_fabric", "lightning.pytorch",
                     "lightning.fabric")


def shard_units(model: nn.Module, mesh: Any) -> nn.Module:
    """torch's FSDP2 over the units the course's `FullyShardedDataParallel` picks
    (`default_units`: TinyGPT's blocks, TinyMLP's Linear layers), then the root (what is left:
    embeddings, tied head, final norm), on the 1-D device mesh `mesh`. In place; returns it."""
    for unit in default_units(model):
        fully_shard(unit, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


class CourseModule(pl.LightningModule):
    """A course model trained by Lightning with plain SGD (module docstring).

    ``sync_log=True`` logs the loss with ``sync_dist=True`` (Lightning all-reduces it across
    ranks every step). Under `ModelParallelStrategy`, ``configure_model`` shards the model with
    `shard_units` over the strategy's ``data_parallel`` mesh dimension.
    """

    def __init__(self, model: nn.Module, *, lr: float, sync_log: bool = False) -> None:
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"CourseModule(model=...) must be an nn.Module (TinyGPT or "
                            f"TinyMLP), got {type(model).__name__}")
        self.model = model
        self.lr = check_positive("CourseModule", "lr", lr)
        self.sync_log = sync_log
        self.step_losses: list[float] = []
        """This rank's loss at every optimizer step, before the step."""
        self.seen: list[list[int]] = []
        """The sample indices of this rank's batch at every step."""

    def forward(self, x: Tensor) -> Any:
        return self.model(x)

    def training_step(self, batch: tuple[Tensor, Tensor, Tensor], batch_idx: int) -> Tensor:
        index, x, y = batch
        loss = course_loss(self.model, x, y)
        self.step_losses.append(loss.item())
        self.seen.append(index.tolist())
        if self.sync_log:
            self.log("loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)

    def configure_model(self) -> None:
        mesh = self.device_mesh  # set by ModelParallelStrategy, None under DDP
        if mesh is not None and not isinstance(self.model, FSDPModule):  # once per model
            shard_units(self.model, mesh["data_parallel"])


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Lightning without its banners: its info logs and the warnings that do not apply to a
    small CPU run (the hint to use ``srun`` because SLURM is installed, too few DataLoader
    workers, deprecations inside Lightning). Errors still show."""
    levels = {}
    for name in LIGHTNING_LOGGERS:
        levels[name] = logging.getLogger(name).level
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", module=r"(pytorch_lightning|lightning_fabric)\b")
            warnings.filterwarnings("ignore", message=r".*(srun|num_workers|LeafSpec)")
            yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


@dataclass(frozen=True)
class RankRecord:
    """What `RecorderCallback` saw in one rank's process, from ``setup`` to ``teardown``."""

    rank: int
    events: list[Event]
    """Every torch.distributed call made through Python, in order."""
    written: int | None
    """`written_bytes` over the same span (None without /proc)."""
    step_losses: list[float]
    seen: list[list[int]]
    params: dict[str, Tensor]
    """The model's full parameters after training, on the CPU."""


class RecorderCallback(pl.Callback):
    """Records a rank's communication in whatever process Lightning runs it (module docstring).

    ``threads``: intra-op threads for the rank (None: as they are). Ranks share the cores, and a
    forked rank whose parent had used its OpenMP pool can hang in its first parallel op unless
    it sets its thread count first (libgomp is not fork-safe). Picklable before ``setup``
    (Lightning's spawn launcher sends it to fresh interpreters).
    """

    def __init__(self, folder: str | Path, *, threads: int | None = None) -> None:
        self.folder = Path(folder)
        self.threads = None if threads is None else check_int("RecorderCallback", "threads",
                                                              threads)
        self._stack: contextlib.ExitStack | None = None
        self._trace: comm.Trace | None = None
        self._written: int | None = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        self._stack = contextlib.ExitStack()
        self._trace = self._stack.enter_context(comm.recording())  # installs the wrappers
        self._written = written_bytes()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._stack is None or self._trace is None:
            return
        end = written_bytes()
        self._stack.close()
        model = getattr(pl_module, "model", pl_module)
        params = {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().to("cpu").clone()
                  for n, p in model.named_parameters()}  # a DTensor's gather: not recorded
        record = RankRecord(
            rank=trainer.global_rank, events=list(self._trace.events),
            written=None if end is None or self._written is None else end - self._written,
            step_losses=list(getattr(pl_module, "step_losses", [])),
            seen=list(getattr(pl_module, "seen", [])), params=params)
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"rank{record.rank}.pkl"
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(pickle.dumps(record))
        tmp.replace(path)  # the parent never reads half a file
        self._stack = self._trace = None


def read_recorded(folder: str | Path, world_size: int) -> list[RankRecord]:
    """Every rank's `RankRecord` from `folder`, in rank order (files our own ranks wrote)."""
    folder = Path(folder)
    missing = [r for r in range(world_size) if not (folder / f"rank{r}.pkl").is_file()]
    if missing:
        raise FileNotFoundError(f"read_recorded: no record from ranks {missing} in {folder}: "
                                "did the run pass RecorderCallback(folder) to the Trainer?")
    return [pickle.loads((folder / f"rank{r}.pkl").read_bytes()) for r in range(world_size)]


@dataclass(frozen=True)
class Responsibility:
    """One job of a training loop on several ranks, and who does it."""

    job: str
    lightning: str
    """What Lightning 2.6 does (the source file that does it)."""
    course: str
    """The course's own code for the same job."""
    course_names: tuple[str, ...]
    """Importable names of that code (tests/test_frameworks.py imports each)."""


RESPONSIBILITIES: tuple[Responsibility, ...] = (
    Responsibility(
        "process launch",
        "Trainer(devices=2) picks a launcher: 'ddp' runs the script again per rank "
        "(strategies/launchers/subprocess_script.py), 'ddp_spawn' uses mp.spawn, 'ddp_notebook' "
        "forks; none when LOCAL_RANK is set (torchrun, SLURM, toolkit.launch.spawn)",
        "spawn(fn, 2): fork, file rendezvous, tagged output, timeouts, tracebacks",
        ("toolkit.launch.spawn",)),
    Responsibility(
        "sampler",
        "replaces the training DataLoader's sampler by DistributedSampler(shuffle=True, "
        "seed=0) and calls set_epoch every epoch (trainer/connectors/data_connector.py)",
        "shard_indices(n, rank=, world_size=, epoch=): the same rule, from scratch",
        ("toolkit.data_parallel.sampler.shard_indices",)),
    Responsibility(
        "gradient sync",
        "wraps the module in torch's DistributedDataParallel (C++ reducer, 25 MB buckets), or "
        "FSDP2 through ModelParallelStrategy + configure_model",
        "OverlappedDDP (lesson 04), FullyShardedDataParallel (lesson 08)",
        ("toolkit.data_parallel.ddp.OverlappedDDP",
         "toolkit.data_parallel.fsdp.FullyShardedDataParallel")),
    Responsibility(
        "checkpointing",
        "ModelCheckpoint: rank 0 writes model, optimizer and loop state; the path is "
        "broadcast, ranks wait at a barrier (callbacks/model_checkpoint.py)",
        "save_checkpoint / load_checkpoint: atomic, rank 0 writes, RNG states (lesson 04)",
        ("toolkit.checkpoint.save_checkpoint", "toolkit.checkpoint.load_checkpoint")),
    Responsibility(
        "precision",
        "Trainer(precision='bf16-mixed') runs forward under torch.autocast, '16-mixed' adds a "
        "GradScaler (plugins/precision/amp.py)",
        "FullyShardedDataParallel(compute_dtype=torch.bfloat16): bf16 gathers and compute, "
        "fp32 shards",
        ("toolkit.data_parallel.fsdp.FullyShardedDataParallel",)),
    Responsibility(
        "logging",
        "self.log(..., sync_dist=True) all-reduces the value across ranks; loggers write on "
        "rank 0 only (core/module.py, trainer/connectors/logger_connector)",
        "each rank returns its numbers from spawn; output tagged [rank N]",
        ("toolkit.launch.spawn",)),
    Responsibility(
        "stopping together",
        "broadcasts rank 0's 'got SIGTERM' flag before every training step, so all ranks stop "
        "at the same step (loops/training_epoch_loop.py)",
        "spawn stops every rank when one fails (RankError); checkpoints + restart (lesson 04)",
        ("toolkit.launch.RankError",)),
)
"""What the framework does for the user, beside the course's code for the same job."""
