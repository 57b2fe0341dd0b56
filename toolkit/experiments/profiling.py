"""One data-parallel training step profiled with `torch.profiler` on every rank, beside what
`toolkit.comm`'s recorder and gradient hooks see of the same step (lesson 06).

    warm_profiler()                                   # once per process, before forking ranks
    run = profile_step("overlapped", folder=tmp)      # 2 gloo ranks, one traced step
    spans = toolkit.viz.trace.merge_traces(run.traces)   # every rank's events on one clock
    toolkit.viz.overlap.overlap_table(spans)          # compute, comm, hidden, exposed per rank

Each rank builds the same `TinyMLP` (width × width, `depth` hidden layers; the model of lesson
04's timeline), wraps it (`VARIANTS`), runs two warm-up steps (torch DDP re-buckets in its
second forward, broadcasting the new layout), then one step (forward, backward: the wrappers
wait for their all-reduces inside backward) under ``torch.profiler.profile``
(CPU activity, and CUDA on a GPU; record_shapes for the bytes of each collective) and
``comm.recording()``, with a post-accumulate-grad hook per Linear weight that marks when its
gradient is ready (lesson 04's compute spans). Each rank writes its Chrome trace to
``folder/<variant>-rank<r>.json``; the parent reads them back (`ProfiledStep.traces`), and
`toolkit.viz.trace` parses and merges them.

Memory (``profile_memory=True``): the profiler also records every allocation and free of the
step (``[memory]`` events, read by `toolkit.viz.memory_trace.profiler_allocations`), and on a
GPU each rank records the CUDA caching allocator's history around the step
(``torch.cuda.memory._record_memory_history``) and saves ``torch.cuda.memory._snapshot()`` as
``folder/<label>-rank<r>-snapshot.pickle`` (the file https://pytorch.org/memory_viz opens;
`ProfiledStep.snapshots` holds them loaded). Backends: ``"gloo"`` (default: CPU ranks, the
traces name gloo's threads), ``"nccl"`` (one GPU per rank; Kineto adds the kernels of every
CUDA stream, NCCL's among them), or ``"auto"``. CUDA is only ever touched inside the ranks, which
NCCL starts as fresh interpreters, so the calling process stays safe to fork later ranks.

The slow variants are lesson 06's exercises, each one change from ``"overlapped"``:
``"blocking"`` all-reduces after backward (`BucketedDDP`); ``"small buckets"`` caps buckets at
1 KiB (one all-reduce per tensor); ``"copy in a loop"`` moves the batch to the device one
sample at a time (a host-to-device copy per sample on a GPU; a real copy per sample here).
"""

from __future__ import annotations

import json
import pickle
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

from .. import comm
from ..arguments import check_int, check_positive
from ..comm.events import Event
from ..data_parallel.ddp import BucketedDDP, OverlappedDDP
from ..launch import device, spawn
from ..models import TinyMLP, make_regression_data

__all__ = ["DIAGNOSIS_OF", "EXERCISE_SETUP", "ProfiledStep", "SLOW", "SMALL_CAP_MB", "VARIANTS",
           "mystery_steps", "profile_step", "warm_profiler"]

SMALL_CAP_MB = 256 / 2**20
"""The "small buckets" variant's cap: 256 bytes, below every tensor, so each is a bucket."""
VARIANTS = {
    "overlapped": "OverlappedDDP: bucket all-reduces launched during backward",
    "torch": "torch.nn.parallel.DistributedDataParallel (its C++ reducer; gloo here)",
    "blocking": "BucketedDDP: the same buckets, all-reduced after backward",
    "small buckets": "OverlappedDDP with a 256-byte bucket cap: one all-reduce per tensor",
    "copy in a loop": "OverlappedDDP, the batch moved to the device one sample at a time",
}
"""The wrappers and slow steps `profile_step` can run (name → what it is)."""
SLOW = ("blocking", "small buckets", "copy in a loop")
DIAGNOSIS_OF = {"blocking": "blocking all-reduce", "small buckets": "bucket cap too small",
                "copy in a loop": "copy in a loop"}
"""Each slow variant's bottleneck, in the words of `toolkit.viz.overlap.DIAGNOSES`."""
EXERCISE_SETUP = dict(width=128, depth=6, batch=256, cap_mb=0.25)
"""The exercises' model: 7 Linear layers of 128 × 128 (14 gradient tensors of 64 KiB and
512 bytes), 256 samples per rank, 2 buckets of 0.25 MiB in the overlapped step."""


def warm_profiler() -> None:
    """Profile nothing once in this process: the first ``profile()`` initialises the profiler
    (seconds); ranks forked afterwards inherit it instead of each paying for it."""
    with profile(activities=[ProfilerActivity.CPU]):
        pass


def _wrap(variant: str, model: nn.Module, cap_mb: float) -> nn.Module:
    if variant == "torch":
        return nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap_mb)
    if variant == "blocking":
        return BucketedDDP(model, bucket_cap_mb=cap_mb)
    return OverlappedDDP(model, bucket_cap_mb=SMALL_CAP_MB if variant == "small buckets"
                         else cap_mb)


def _profiled_rank(rank: int, world_size: int, variant: str, width: int, depth: int,
                   batch: int, cap_mb: float, folder: str, label: str,
                   profile_memory: bool) -> dict:
    dev = device()
    model = TinyMLP(d_in=width, d_hidden=width, d_out=width, depth=depth, seed=0, device=dev)
    marks: list[tuple[str, float]] = []  # (label, time) when each Linear's weight gradient is final
    linears = [m for m in model.layers if isinstance(m, nn.Linear)]
    for i, lin in enumerate(linears):
        lin.weight.register_post_accumulate_grad_hook(
            lambda p, i=i: marks.append((f"layer {i} backward", time.time())))
    ddp = _wrap(variant, model, cap_mb)
    # The batch as a data loader hands it over: on the host, moved to the device in the step.
    host_x, host_y = make_regression_data(batch, width, width, seed=rank)

    def to_device(t: torch.Tensor) -> torch.Tensor:
        if variant == "copy in a loop":  # one copy per sample: the slow way
            return torch.stack([row.to(dev, copy=True) for row in t])
        return t.to(dev, copy=True)  # one copy of the whole batch

    def step() -> torch.Tensor:
        ddp.zero_grad(set_to_none=True)
        with record_function("data to device"):
            x, y = to_device(host_x), to_device(host_y)
        with record_function("forward"):
            loss = F.mse_loss(ddp(x), y)
        with record_function("backward"):
            loss.backward()  # every wrapper waits for its all-reduces in here
        return loss

    for _ in range(2):  # warm-up: allocations; torch DDP rebuilds its buckets in the 2nd forward
        step()
    cuda = dev.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    snapshot_path = Path(folder) / f"{label}-rank{rank}-snapshot.pickle"
    if profile_memory and cuda:  # the allocator's history from here on, Python stacks only
        torch.cuda.memory._record_memory_history(max_entries=100_000, stacks="python")
    dist.barrier()  # both ranks start the traced step together
    marks.clear()
    with profile(activities=activities, record_shapes=True,
                 profile_memory=profile_memory) as prof, comm.recording() as trace:
        t0 = time.time()
        step()
        if cuda:
            torch.cuda.synchronize(dev)  # the kernels have run before the profile closes
    if profile_memory and cuda:
        with open(snapshot_path, "wb") as f:
            pickle.dump(torch.cuda.memory._snapshot(), f)
        torch.cuda.memory._record_memory_history(enabled=None)
    path = Path(folder) / f"{label}-rank{rank}.json"
    prof.export_chrome_trace(str(path))
    spans, prev = [], t0
    for label, t in marks:
        spans.append((label, prev, t))
        prev = t
    buckets = len(getattr(ddp, "buckets", ())) or None
    dist.barrier()  # no rank exits while a peer may still talk to it
    return {"path": str(path), "events": [e.as_tuple() for e in trace], "compute": spans,
            "buckets": buckets, "device": str(dev),
            "snapshot": str(snapshot_path) if profile_memory and cuda else None}


@dataclass
class ProfiledStep:
    """One profiled step on every rank (module docstring)."""

    variant: str
    paths: list[Path]
    """Each rank's Chrome trace, in rank order."""
    traces: list[dict]
    """The traces' JSON, in rank order (`toolkit.viz.trace.merge_traces` puts them on one
    clock)."""
    recorded: list[Event]
    """`toolkit.comm`'s events of the step, every rank (torch DDP's C++ calls are invisible)."""
    compute: dict[int, list[tuple[str, float, float]]] = field(default_factory=dict)
    """Per rank, backward compute spans from gradient-ready hooks (lesson 04's view)."""
    buckets: int | None = None
    """Buckets of the toolkit's wrapper (None for torch DDP, which keeps them in C++)."""
    devices: list[str] = field(default_factory=list)
    """Each rank's device (``cpu``, ``cuda:0``...), in rank order."""
    snapshots: list[dict] | None = None
    """Each rank's CUDA memory snapshot (``profile_memory`` on a GPU), in rank order."""


def profile_step(variant: str = "overlapped", *, folder: str | Path, world_size: int = 2,
                 width: int = 256, depth: int = 4, batch: int = 512, cap_mb: float = 0.25,
                 backend: str = "gloo", profile_memory: bool = False, label: str | None = None,
                 timeout: float = 60) -> ProfiledStep:
    """Profile one step of `variant` (`VARIANTS`) on `world_size` ranks of `backend` (module
    docstring); `batch` samples per rank; files named after `label` (default: the variant).
    Call `warm_profiler` first in a notebook."""
    if variant not in VARIANTS:
        raise ValueError(f"profile_step: variant must be one of {list(VARIANTS)}, got "
                         f"{variant!r}")
    if backend not in ("gloo", "nccl", "auto"):
        raise ValueError(f"profile_step: backend must be 'gloo', 'nccl' or 'auto', got "
                         f"{backend!r}")
    label = (label or variant).replace(" ", "-")
    check_int("profile_step", "world_size", world_size, low=1)
    for name, value in (("width", width), ("depth", depth), ("batch", batch)):
        check_int("profile_step", name, value)
    check_positive("profile_step", "cap_mb", cap_mb, hint="MiB per bucket")
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"profile_step: folder {folder} does not exist; create it first "
                         "(e.g. tempfile.mkdtemp())")
    out = spawn(_profiled_rank, world_size, variant, width, depth, batch, cap_mb, str(folder),
                label, profile_memory, backend=backend, echo=False, timeout=timeout)
    paths = [Path(r["path"]) for r in out]
    traces = [json.loads(p.read_text(encoding="utf-8")) for p in paths]
    snapshots = None
    if all(r["snapshot"] for r in out):
        snapshots = []
        for r in out:  # written by our own ranks a moment ago
            with open(r["snapshot"], "rb") as f:
                snapshots.append(pickle.load(f))
    return ProfiledStep(variant=variant, paths=paths, traces=traces,
                        recorded=[Event.from_tuple(e) for r in out for e in r["events"]],
                        compute={rank: r["compute"] for rank, r in enumerate(out)},
                        buckets=out[0]["buckets"], devices=[r["device"] for r in out],
                        snapshots=snapshots)


def mystery_steps(*, folder: str | Path, seed: int = 0, world_size: int = 2,
                  timeout: float = 60) -> dict[str, ProfiledStep]:
    """The three slow variants profiled with `EXERCISE_SETUP`, under the names "A", "B", "C" in
    an order drawn from `seed` (lesson 06's exercise: which bottleneck is which?). Each step's
    ``variant`` and file names say only its letter: the answer is in the traces."""
    order = random.Random(seed).sample(SLOW, k=len(SLOW))
    steps = {}
    for name, variant in zip("ABC", order):
        run = profile_step(variant, folder=folder, world_size=world_size, timeout=timeout,
                           label=f"mystery-{name}", **EXERCISE_SETUP)
        run.variant = f"mystery {name}"
        steps[name] = run
    return steps
