"""Checkpoints that survive a crash: atomic writes, rank 0 writes, every rank resumes.

A long run is killed sooner or later (a node fails, the job's time ends, torchrun restarts the
group after a rank dies). Three rules make resuming safe:

* **Atomic save.** Write the new checkpoint to a temporary file *in the same folder*, flush it,
  ``fsync`` it (the bytes are on disk, not in the page cache), then ``os.replace`` it over the
  old name, and ``fsync`` the folder (the rename itself is on disk). ``os.replace`` is atomic
  on POSIX within one file system: a reader sees the old file or the new one, never half of
  one. A writer killed mid-write leaves a stray temporary file and the last good checkpoint.
  (Writing straight to the final name would leave a truncated file that no longer loads:
  ``tests/test_checkpoint.py`` kills both kinds of writer to show it.)
* **One writer.** Under data parallelism the replicas are identical, so only rank 0 writes;
  the others wait at a barrier, so that when `save_checkpoint` returns the file exists for all.
* **Everything needed to continue bit for bit**: model and optimizer state, the step, and the
  random-number state of *every* rank (each rank draws different dropout masks and data
  orders), gathered to rank 0 with ``all_gather_object``.

`load_checkpoint` is called by every rank: each reads the file (a shared file system), loads
the model and optimizer, restores its own RNG state, and meets the others at a barrier. It
returns None when there is no checkpoint yet, so one script serves the first start and every
restart (``torchrun --max-restarts=3``)::

    info = load_checkpoint(path, model=model, optimizer=opt)
    start = 0 if info is None else info.step
    for step in range(start, steps):
        train_step(...)
        save_checkpoint(path, model=model, optimizer=opt, step=step + 1)

A wrapped model (`toolkit.data_parallel` DDPs, torch's DDP: anything with a ``.module``) is
saved unwrapped, so a checkpoint loads with or without the wrapper. Files are read with
``torch.load(weights_only=True)``: tensors and plain containers only, no pickled code.
"""

from __future__ import annotations

import glob
import os
import random
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .arguments import check_int
from .launch.gpus import gpu_count

__all__ = ["CheckpointInfo", "atomic_save", "get_rng_state", "load_checkpoint",
           "save_checkpoint", "set_rng_state"]

FORMAT = 1
"""Version of the dictionary layout written by `save_checkpoint`."""


@dataclass(frozen=True)
class CheckpointInfo:
    """What `load_checkpoint` found besides the states it loaded."""

    step: int
    """The step saved with the checkpoint (by convention: optimizer steps already taken)."""
    world_size: int
    """Number of ranks that wrote it."""
    extra: dict
    """Whatever was passed as ``extra=`` to `save_checkpoint` (e.g. the data loader's epoch)."""


def _tmp_prefix(path: Path) -> str:
    return f".{path.name}.tmp."


def atomic_save(obj: Any, path: str | os.PathLike) -> Path:
    """``torch.save(obj)`` to ``path`` so that ``path`` is always either the old or the new file.

    Temp file in the same folder (``os.replace`` is atomic only within one file system), fsync
    of the file, rename, fsync of the folder. Stray temp files of earlier, killed writers of the
    same path are removed first (this assumes one writer per path, as `save_checkpoint` has).
    """
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    folder.mkdir(parents=True, exist_ok=True)
    for stale in glob.glob(str(folder / (glob.escape(_tmp_prefix(path)) + "*"))):
        try:
            os.unlink(stale)
        except FileNotFoundError:
            pass
    fd, tmp = tempfile.mkstemp(prefix=_tmp_prefix(path), dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)
    return path


def get_rng_state() -> dict:
    """This process's random state: torch (CPU, and this rank's GPU if CUDA is in use),
    `random`, numpy if present.

    Stored as tensors and plain containers so that ``torch.load(weights_only=True)`` reads it.
    """
    py_version, py_state, py_gauss = random.getstate()
    state: dict[str, Any] = {"torch": torch.get_rng_state(),
                             "python": [py_version, list(py_state), py_gauss]}
    if torch.cuda.is_initialized():  # never is_available(): it would start the CUDA driver
        # The current device's only (cuda:LOCAL_RANK under NCCL): get_rng_state_all() would
        # create a CUDA context on every GPU of the node in every rank.
        state["cuda_device"] = torch.cuda.get_rng_state()
    try:
        import numpy as np
    except ImportError:
        return state
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state["numpy"] = [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss),
                      float(cached)]
    return state


def set_rng_state(state: dict) -> None:
    """Restore what `get_rng_state` returned."""
    torch.set_rng_state(state["torch"])
    version, py_state, gauss = state["python"]
    random.setstate((version, tuple(py_state), gauss))
    if "cuda_device" in state and gpu_count() > 0:  # none in a CPU rank: its GPUs are hidden
        torch.cuda.set_rng_state(state["cuda_device"])  # this rank's current device
    if "numpy" in state:
        import numpy as np
        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))


def _unwrap(model: nn.Module) -> nn.Module:
    while isinstance(getattr(model, "module", None), nn.Module):
        model = model.module
    return model


def _dist() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def save_checkpoint(path: str | os.PathLike, *, model: nn.Module,
                    optimizer: torch.optim.Optimizer | None = None, step: int,
                    extra: dict | None = None) -> None:
    """Save model, optimizer, ``step``, every rank's RNG state and ``extra`` to ``path``.

    Collective when a process group is initialised: every rank must call it (the RNG states
    are gathered); rank 0 alone writes, with `atomic_save`; all return after the file is in
    place. Without a process group it simply writes.
    """
    check_int("save_checkpoint", "step", step, low=0)
    rank, world = _dist()
    rng: list[dict] = [get_rng_state()]
    if world > 1:
        rng = [None] * world  # type: ignore[list-item]
        dist.all_gather_object(rng, get_rng_state())
    if rank == 0:
        atomic_save({"format": FORMAT, "step": step, "world_size": world,
                     "model": _unwrap(model).state_dict(),
                     "optimizer": None if optimizer is None else optimizer.state_dict(),
                     "rng": rng, "extra": dict(extra or {})}, path)
    if world > 1:
        dist.barrier()  # nobody goes on (or reads the file) before it is complete


def load_checkpoint(path: str | os.PathLike, *, model: nn.Module,
                    optimizer: torch.optim.Optimizer | None = None,
                    restore_rng: bool = True) -> CheckpointInfo | None:
    """Load ``path`` into ``model`` (and ``optimizer``) on this rank; None if there is no file.

    Every rank calls it (it ends with a barrier). Each restores its own saved RNG state; when
    the world size changed since the save, RNG states are left alone with a warning (which
    rank's stream would a new rank continue?).
    """
    path = Path(path)
    rank, world = _dist()
    if not path.exists():
        if world > 1:
            dist.barrier()
        return None
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    if ckpt.get("format") != FORMAT:
        raise ValueError(f"load_checkpoint: {path} has format {ckpt.get('format')!r}, "
                         f"expected {FORMAT}")
    _unwrap(model).load_state_dict(ckpt["model"])
    if optimizer is not None:
        if ckpt["optimizer"] is None:
            raise ValueError(f"load_checkpoint: {path} holds no optimizer state")
        optimizer.load_state_dict(ckpt["optimizer"])
    if restore_rng:
        if len(ckpt["rng"]) == world:
            set_rng_state(ckpt["rng"][rank])
        else:
            warnings.warn(f"load_checkpoint: saved by {len(ckpt['rng'])} ranks, loaded by "
                          f"{world}: random states not restored", stacklevel=2)
    if world > 1:
        dist.barrier()
    return CheckpointInfo(step=int(ckpt["step"]), world_size=int(ckpt["world_size"]),
                          extra=ckpt["extra"])
