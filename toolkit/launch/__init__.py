"""Start N real ranks (processes) from a notebook cell, a script or a test.

    from toolkit.launch import device, spawn

    def hello(rank, world_size):
        t = torch.tensor([float(rank)], device=device())   # cpu on gloo, cuda:LOCAL_RANK on NCCL
        dist.all_reduce(t)
        return t.item()

    spawn(hello, world_size=4)      # -> [6.0, 6.0, 6.0, 6.0]

gloo on CPU by default, NCCL with one GPU per rank when there are enough GPUs, and with
``device="cuda"`` (or ``TOOLKIT_DEVICE=cuda``) ranks that share fewer GPUs: the same code.
Under torchrun or SLURM the same worker runs with `run_from_env(fn)`. Inside a rank,
`context()` says who it is and `device()` where its tensors go. `gpu_count()` counts GPUs
without starting the CUDA driver in the caller (`toolkit.launch.gpus`).
"""

from .context import (
    BACKENDS,
    DEVICES,
    Placement,
    RankContext,
    context,
    default_device,
    device,
    init_from_env,
    resolve_placement,
    run_from_env,
)
from .errors import RankError, SpawnError, SpawnTimeout
from .gpus import GpuInfo, driver_live, gpu_count, visible_gpus
from .launcher import DEFAULT_TIMEOUT, spawn
from .spawn_arguments import START_METHODS

__all__ = [
    "BACKENDS",
    "DEFAULT_TIMEOUT",
    "DEVICES",
    "START_METHODS",
    "GpuInfo",
    "Placement",
    "RankContext",
    "RankError",
    "SpawnError",
    "SpawnTimeout",
    "context",
    "default_device",
    "device",
    "driver_live",
    "gpu_count",
    "init_from_env",
    "resolve_placement",
    "run_from_env",
    "spawn",
    "visible_gpus",
]
