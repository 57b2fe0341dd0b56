"""Where a grade's ranks run: ``--device cpu|cuda|auto`` and ``--gpus-per-grade`` (issue 18).

A CUDA grade gives its ranks the GPUs of the grade's set (made visible with
``CUDA_VISIBLE_DEVICES``): rank r uses ``cuda:(r mod G)`` of a set of G. With one GPU per rank
of the largest launch (G = p) each rank has a GPU of its own; with fewer, the ranks share them
(``--gpus-per-grade 1``: every rank on the one GPU), which is how a one-GPU machine grades on
its GPU, and the report says so (`shared_note`). Concurrent grades (``batch --jobs N``) get
disjoint sets: the visible GPUs are cut into sets of G, and never more grades run at once than
there are sets. Bytes still travel through the courier (staged through host memory:
`sandbox.channel.tensor_bytes` copies to the CPU before encoding), so every cross-check of
docs/grading.md holds on GPU as on CPU, shared or not; values are judged on CPU copies with
the same tolerances.

    gpus = visible_gpus()                        # [0, 1, 2, 3, 4, 5, 6, 7]
    device = resolve_device("auto", gpus=len(gpus), ranks=4)     # "cuda"
    gpu_sets(gpus, per_grade=4, jobs=3)          # [[0, 1, 2, 3], [4, 5, 6, 7]]: 2 at a time

Nothing here starts a process or touches a GPU: GPUs are counted by
`toolkit.launch.gpus` (NVML, never the CUDA driver), so the grader may fork afterwards.
"""

from __future__ import annotations

import os
from typing import Mapping

from toolkit.launch.gpus import gpu_count, hidden_cuda_env

DEVICES = ("cpu", "cuda", "auto")


def visible_gpus(env: Mapping[str, str] | None = None, count: int | None = None) -> list[int]:
    """The GPU ids this process may hand out: ``CUDA_VISIBLE_DEVICES`` when it is set (its
    entries, in order; "" means none), else ``0 .. count - 1`` where `count` defaults to the
    GPUs CUDA would show (`toolkit.launch.gpus.gpu_count`: 0 on a CPU build)."""
    env = os.environ if env is None else env
    if count is None:
        count = gpu_count(env)
    listed = env.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return list(range(count))
    ids = [part.strip() for part in listed.split(",") if part.strip()]
    if not all(part.isdigit() for part in ids):
        raise ValueError(f"CUDA_VISIBLE_DEVICES must list GPU numbers (e.g. 0,1,2,3) for "
                         f"--device cuda, got {listed!r}")
    return [int(part) for part in ids][:count] if count else []


def resolve_device(asked: str, *, gpus: int, ranks: int) -> str:
    """``"cpu"`` or ``"cuda"`` for a grade whose largest launch has `ranks` ranks, when `gpus`
    GPUs can be given to one grade. ``auto`` is cuda when there is one GPU per rank, else cpu;
    ``cuda`` is cuda with any GPU (the ranks share fewer GPUs than ranks) and an error that
    says what to do without one."""
    if asked not in DEVICES:
        raise ValueError(f"--device must be one of {', '.join(DEVICES)}, got {asked!r}")
    if asked == "cpu":
        return "cpu"
    if gpus >= ranks or (asked == "cuda" and gpus >= 1):
        return "cuda"
    if asked == "auto":
        return "cpu"
    raise ValueError("--device cuda: no CUDA GPU is visible here (NVML counts none, torch is a "
                     "CPU build, or CUDA_VISIBLE_DEVICES is empty). Grade on CPU with --device "
                     "cpu (the default), or run on a GPU node.")


def gpu_sets(gpus: list[int], *, per_grade: int, jobs: int) -> list[list[int]]:
    """Disjoint sets of `per_grade` GPUs from `gpus`, at most `jobs` of them: the grades that
    run at once, one set each (so ``len(result)`` is how many grades may run at once)."""
    if not isinstance(per_grade, int) or per_grade < 1:
        raise ValueError(f"--gpus-per-grade must be an int >= 1, got {per_grade!r}")
    if not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"--jobs must be an int >= 1, got {jobs!r}")
    n = min(jobs, len(gpus) // per_grade)
    if n == 0:
        raise ValueError(f"--gpus-per-grade {per_grade}: only {len(gpus)} GPU(s) are visible "
                         f"({gpus}); ask for at most {len(gpus)} per grade, or grade on CPU "
                         "with --device cpu")
    return [gpus[k * per_grade:(k + 1) * per_grade] for k in range(n)]


def grade_env(device: str, gpus: list[int] | None = None) -> dict[str, str]:
    """The environment a grader process (and its sandbox) gets for `device`: the GPUs of its
    set visible on cuda; on cpu none, and torch's availability check answered without the
    CUDA driver (`toolkit.launch.gpus.hidden_cuda_env`)."""
    if device == "cpu":
        return hidden_cuda_env()
    if device != "cuda":
        raise ValueError(f"device must be 'cpu' or 'cuda' once resolved, got {device!r}")
    if not gpus:
        raise ValueError("a cuda grade needs its GPU set (gpu_sets); got none")
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus)}


def rank_device(device: str, rank: int, gpus: int | None = None) -> str:
    """The device rank `rank` puts its tensors on: GPU ``rank mod gpus`` of the grade's set of
    `gpus` (None: one GPU per rank)."""
    if device == "cpu":
        return "cpu"
    return f"cuda:{rank % gpus if gpus else rank}"


def shared_note(*, ranks: int, gpus: int) -> str | None:
    """What a report says when a cuda grade's ranks share its GPUs (None when they do not)."""
    if gpus >= ranks:
        return None
    return (f"The ranks shared {gpus} GPU{'s' if gpus > 1 else ''} (up to {ranks} ranks, rank r "
            f"on cuda:(r mod {gpus})): values and messages are judged as with a GPU per rank; "
            "times and memory are not those of one GPU per rank.")


__all__ = ["DEVICES", "gpu_sets", "grade_env", "rank_device", "resolve_device", "shared_note",
           "visible_gpus"]
