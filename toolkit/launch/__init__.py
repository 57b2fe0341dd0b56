"""Start N real ranks (processes) from a notebook cell, a script or a test.

    from toolkit.launch import device, spawn

    def hello(rank, world_size):
        t = torch.tensor([float(rank)], device=device())   # cpu on gloo, cuda:LOCAL_RANK on NCCL
        dist.all_reduce(t)
        return t.item()

    spawn(hello, world_size=4)      # -> [6.0, 6.0, 6.0, 6.0]

gloo on CPU by default, NCCL with one GPU per rank when there are enough GPUs: the same code.
Under torchrun or SLURM the same worker runs with `run_from_env(fn)`. Inside a rank,
`context()` says who it is and `device()` where its tensors go.
"""

from .context import BACKENDS, RankContext, context, device, gpu_count, init_from_env, run_from_env
from .errors import RankError, SpawnError, SpawnTimeout
from .launcher import DEFAULT_TIMEOUT, START_METHODS, spawn

__all__ = [
    "BACKENDS",
    "DEFAULT_TIMEOUT",
    "START_METHODS",
    "RankContext",
    "RankError",
    "SpawnError",
    "SpawnTimeout",
    "context",
    "device",
    "gpu_count",
    "init_from_env",
    "run_from_env",
    "spawn",
]
