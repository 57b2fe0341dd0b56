"""Who this rank is and which device it uses, in a `spawn` rank or under `torchrun`.

Worker code asks `context()` (or just `device()`) instead of reading environment variables, so
the same function runs from a notebook (`spawn`), from a script, and under torchrun or SLURM
(`init_from_env` / `run_from_env`).
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch
import torch.distributed as dist

from .. import comm
from .gpus import gpu_count

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
    """Where this rank's tensors should live: ``cpu`` for gloo, ``cuda:local_rank`` for NCCL,
    ``cuda:(local_rank mod G)`` when the ranks share G GPUs."""
    placement: str = "cpu"
    """``"cpu"``, ``"gpu"`` (a GPU of its own) or ``"shared"`` (`Placement.kind`)."""


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
                           int(os.environ.get("LOCAL_WORLD_SIZE", world)), backend, dev,
                           "gpu" if backend == "nccl" else "cpu")
    raise RuntimeError(
        "not inside a rank: context() and device() work in a function started by "
        "toolkit.launch.spawn(...), or after toolkit.launch.init_from_env() under torchrun"
    )


def device() -> torch.device:
    """The device the calling rank should put its tensors on."""
    return context().device


DEVICES = ("auto", "cpu", "cuda")
DEVICE_VARIABLE = "TOOLKIT_DEVICE"
"""The environment variable that sets the default `device` of every launch (`default_device`):
``TOOLKIT_DEVICE=cuda`` runs a lesson's ranks on the GPUs without changing a cell."""

PLACEMENTS = ("cpu", "gpu", "shared")


@dataclass(frozen=True)
class Placement:
    """Where a launch's ranks run: the backend, and which device each local rank uses."""

    backend: str
    """``"gloo"`` or ``"nccl"``."""
    kind: str
    """``"cpu"`` (gloo on the CPU), ``"gpu"`` (one GPU per rank: ``cuda:local_rank``, NCCL) or
    ``"shared"`` (fewer GPUs than ranks: ``cuda:(local_rank mod gpus)``, gloo on CUDA tensors,
    point-to-point staged through host memory by `toolkit.comm`)."""
    gpus: int = 0
    """GPUs the ranks use (0 on the CPU)."""

    def device(self, local_rank: int) -> torch.device:
        if self.kind == "cpu":
            return torch.device("cpu")
        return torch.device("cuda", local_rank % self.gpus if self.kind == "shared" else
                            local_rank)


def default_device(env: Mapping[str, str] | None = None) -> str:
    """The device launches use when none is given: ``$TOOLKIT_DEVICE`` (auto, cpu or cuda),
    else ``"auto"``. The one place the course reads that variable."""
    value = (os.environ if env is None else env).get(DEVICE_VARIABLE, "").strip().lower()
    if not value:
        return "auto"
    if value not in DEVICES:
        raise ValueError(f"{DEVICE_VARIABLE}={value!r} is not one of {', '.join(DEVICES)}: "
                         f"set it to cuda to run ranks on the GPUs, cpu to keep them on the "
                         f"CPU, or unset it (auto)")
    return value


def resolve_placement(backend: str, device: str | None, local_world_size: int, *,
                      gpus: int | None = None) -> Placement:
    """The `Placement` for `local_world_size` ranks on this host.

    ``device`` (None: `default_device()`): ``"auto"`` is NCCL with one GPU per rank when
    there are enough GPUs (and NCCL is built in), else gloo on the CPU; ``"cpu"`` is gloo on
    the CPU; ``"cuda"`` is NCCL with one GPU per rank when there are enough, else gloo with the
    ranks sharing the GPUs there are (rank r on ``cuda:(r mod G)``). An explicit ``backend``
    narrows it: ``"gloo"`` with ``"cuda"`` shares the GPUs even when there are enough,
    ``"nccl"`` needs a GPU per rank. `gpus` replaces the count (`toolkit.launch.gpus`)."""
    if not isinstance(backend, str) or backend.lower() not in BACKENDS:
        raise ValueError(
            f"backend={backend!r} is not one of {', '.join(map(repr, BACKENDS))}. "
            "Use 'auto' (NCCL when there is a GPU per rank, else gloo on CPU), 'gloo' or 'nccl'."
        )
    device = default_device() if device is None else device
    if not isinstance(device, str) or device.lower() not in DEVICES:
        raise ValueError(f"device={device!r} is not one of {', '.join(map(repr, DEVICES))}: "
                         "'cpu' (gloo on the CPU), 'cuda' (the GPUs there are, shared by the "
                         "ranks if fewer than the ranks) or 'auto' (a GPU per rank, else CPU)")
    backend, device = backend.lower(), device.lower()
    if backend == "gloo" and not dist.is_gloo_available():
        raise ValueError("backend='gloo' is not built into this torch; use 'nccl' or 'auto'")
    if backend == "nccl" and device == "cpu":
        raise ValueError("backend='nccl' runs on GPUs only; device='cpu' needs backend='gloo' "
                         "or 'auto'")
    if (backend == "gloo" and device == "auto") or device == "cpu":
        return Placement("gloo", "cpu")
    count = gpu_count() if gpus is None else gpus
    nccl_ok = count >= local_world_size and dist.is_nccl_available()
    if backend == "nccl" and not nccl_ok:
        cuda = torch.version.cuda
        build = "a CPU-only build" if cuda is None else f"CUDA {cuda}"
        raise ValueError(
            f"backend='nccl' needs one GPU per rank: {local_world_size} ranks on this host, "
            f"but torch {torch.__version__} ({build}) sees {count} GPU(s)"
            f"{'' if dist.is_nccl_available() else ' and has no NCCL'}. "
            "Use backend='gloo' (CPU), or device='cuda' with backend='auto' (ranks share the "
            "GPUs), or fewer ranks.")
    if backend != "gloo" and nccl_ok:
        return Placement("nccl", "gpu", local_world_size)
    if device == "auto":
        return Placement("gloo", "cpu")
    if count < 1:
        raise ValueError(
            f"device='cuda' but torch {torch.__version__} sees no GPU (CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r}). Use device='cpu' or 'auto'"
            f"{' (or unset ' + DEVICE_VARIABLE + ')' if os.environ.get(DEVICE_VARIABLE) else ''}.")
    return Placement("gloo", "shared", min(count, local_world_size))


def resolve_backend(backend: str, local_world_size: int, device: str | None = "auto") -> str:
    """The backend `resolve_placement` picks (``"nccl"`` or ``"gloo"``)."""
    return resolve_placement(backend, device, local_world_size).backend


def rank_device(placement: Placement, local_rank: int) -> torch.device:
    """This rank's device under `placement`, made the current CUDA device when it is a GPU."""
    dev = placement.device(local_rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    return dev


_ENV_NEEDED = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def init_from_env(*, backend: str = "auto", device: str | None = None,
                  timeout: float = 600.0) -> RankContext:
    """Join the process group described by torchrun's (or SLURM-set) environment variables.

    Reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and, when present, LOCAL_RANK and
    LOCAL_WORLD_SIZE; picks the backend and device as `spawn` does (`resolve_placement`);
    wraps `torch.distributed` for the recorder. `timeout` (seconds) bounds every collective.
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
    placement = resolve_placement(backend, device, local_world)
    dev = rank_device(placement, local_rank)
    if not dist.is_initialized():
        kwargs: dict[str, Any] = {}
        if placement.backend == "nccl":
            kwargs["device_id"] = dev
        dist.init_process_group(placement.backend, init_method="env://", rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=timeout),
                                **kwargs)
    comm.attach(rank, None)
    ctx = RankContext(rank, world, local_rank, local_world, placement.backend, dev,
                      placement.kind)
    set_context(ctx)
    return ctx


def run_from_env(fn: Callable[..., Any], *args: Any, backend: str = "auto",
                 device: str | None = None, timeout: float = 600.0) -> Any:
    """Run ``fn(rank, world_size, *args)`` as this torchrun rank and tear the group down after.

    The same worker function that `spawn` runs from a notebook::

        if __name__ == "__main__":
            print(run_from_env(work))     # torchrun --nproc-per-node 4 script.py
    """
    ctx = init_from_env(backend=backend, device=device, timeout=timeout)
    try:
        return fn(ctx.rank, ctx.world_size, *args)
    finally:
        set_context(None)
        if dist.is_initialized():
            dist.destroy_process_group()
