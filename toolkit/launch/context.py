"""Who this rank is and which device it uses, in a `spawn` rank or under `torchrun`.

Worker code asks `context()` (or just `device()`) instead of reading environment variables, so
the same function runs from a notebook (`spawn`), from a script, and under torchrun or SLURM
(`init_from_env` / `run_from_env`).
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

from .. import comm

BACKENDS = ("auto", "gloo", "nccl")


@dataclass(frozen=True)
class RankContext:
    """This process's place in the run."""

    rank: int
    """Global rank, 0 .. world_size-1."""
    world_size: int
    local_rank: int
    """Rank among the processes on this host (picks the GPU)."""
    local_world_size: int
    backend: str
    """``"gloo"`` or ``"nccl"``."""
    device: torch.device
    """Where this rank's tensors should live: ``cpu`` for gloo, ``cuda:local_rank`` for NCCL."""


_current: RankContext | None = None


def set_context(ctx: RankContext | None) -> None:
    global _current
    _current = ctx


def context() -> RankContext:
    """The context of the calling rank.

    Raises RuntimeError outside a rank (no process group), saying how to get one.
    """
    if _current is not None:
        return _current
    if dist.is_available() and dist.is_initialized():
        # A process group someone initialised by hand: describe it as best we can.
        backend = str(dist.get_backend())
        rank, world = dist.get_rank(), dist.get_world_size()
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        dev = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
        return RankContext(rank, world, local_rank,
                           int(os.environ.get("LOCAL_WORLD_SIZE", world)), backend, dev)
    raise RuntimeError(
        "not inside a rank: context() and device() work in a function started by "
        "toolkit.launch.spawn(...), or after toolkit.launch.init_from_env() under torchrun"
    )


def device() -> torch.device:
    """The device the calling rank should put its tensors on."""
    return context().device


def gpu_count() -> int:
    """GPUs torch can see, without creating a CUDA context (0 on a CPU build)."""
    if not torch.cuda.is_available():
        return 0
    return torch.cuda.device_count()


def resolve_backend(backend: str, local_world_size: int) -> str:
    """Turn ``"auto"`` into ``"nccl"`` or ``"gloo"``; check that an explicit choice can run.

    ``auto`` means NCCL when there is one GPU per local rank (and NCCL is built in), otherwise
    gloo on the CPU. Every lesson and lab runs on gloo; NCCL is what instructors get on GPU nodes.
    """
    if not isinstance(backend, str) or backend.lower() not in BACKENDS:
        raise ValueError(
            f"backend={backend!r} is not one of {', '.join(map(repr, BACKENDS))}. "
            "Use 'auto' (NCCL when there is a GPU per rank, else gloo on CPU), 'gloo' or 'nccl'."
        )
    backend = backend.lower()
    gpus = gpu_count()
    if backend == "auto":
        nccl_ok = gpus >= local_world_size and dist.is_nccl_available()
        return "nccl" if nccl_ok else "gloo"
    if backend == "nccl":
        if not dist.is_nccl_available() or gpus < local_world_size:
            cuda = torch.version.cuda
            build = "a CPU-only build" if cuda is None else f"CUDA {cuda}"
            raise ValueError(
                f"backend='nccl' needs one GPU per rank: {local_world_size} ranks on this host, "
                f"but torch {torch.__version__} ({build}) sees {gpus} GPU(s)"
                f"{'' if dist.is_nccl_available() else ' and has no NCCL'}. "
                "Use backend='gloo' (CPU) or 'auto', or fewer ranks."
            )
    if backend == "gloo" and not dist.is_gloo_available():
        raise ValueError("backend='gloo' is not built into this torch; use 'nccl' or 'auto'")
    return backend


def rank_device(backend: str, local_rank: int) -> torch.device:
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


_ENV_NEEDED = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def init_from_env(*, backend: str = "auto", timeout: float = 600.0) -> RankContext:
    """Join the process group described by torchrun's (or SLURM-set) environment variables.

    Reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and, when present, LOCAL_RANK and
    LOCAL_WORLD_SIZE; picks the backend and device as `spawn` does; wraps `torch.distributed`
    for the recorder. `timeout` (seconds) bounds every collective.
    """
    missing = [k for k in _ENV_NEEDED if k not in os.environ]
    if missing:
        raise RuntimeError(
            f"init_from_env() needs {', '.join(missing)} in the environment, which torchrun sets: "
            "run `torchrun --nproc-per-node 4 your_script.py` (or srun with the variables "
            "exported, see docs/cluster.md), or start ranks with toolkit.launch.spawn(...)"
        )
    comm.install()  # before user code makes calls: the recorder sees them
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    chosen = resolve_backend(backend, local_world)
    dev = rank_device(chosen, local_rank)
    if not dist.is_initialized():
        kwargs: dict[str, Any] = {}
        if chosen == "nccl":
            kwargs["device_id"] = dev
        dist.init_process_group(chosen, init_method="env://", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout), **kwargs)
    comm.attach(rank, None)
    ctx = RankContext(rank, world, local_rank, local_world, chosen, dev)
    set_context(ctx)
    return ctx


def run_from_env(fn: Callable[..., Any], *args: Any, backend: str = "auto",
                 timeout: float = 600.0) -> Any:
    """Run ``fn(rank, world_size, *args)`` as this torchrun rank and tear the group down after.

    The same worker function that `spawn` runs from a notebook::

        if __name__ == "__main__":
            print(run_from_env(work))     # torchrun --nproc-per-node 4 script.py
    """
    ctx = init_from_env(backend=backend, timeout=timeout)
    try:
        return fn(ctx.rank, ctx.world_size, *args)
    finally:
        set_context(None)
        if dist.is_initialized():
            dist.destroy_process_group()
