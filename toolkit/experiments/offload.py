"""Offload measured: each tier's read and write speed through the store the optimizer uses, the
update's speed, offloaded steps timed chunk by chunk, and ZeRO-2 ranks that offload their shard;
what lesson 09 shows and `benchmarks/offload_step.py` prints beside `toolkit.cost.offload`.

Tiers, as the optimizer sees them (a `toolkit.offload.Store`'s `read` and `write` of n bytes):

    cpu          host memory (pinned on a GPU machine; here a stand-in: same RAM, a memcpy)
    nvme         a memory-mapped file, served by the page cache (the file fits in free memory)
    nvme cold    the same file, every write sent to the disk and evicted: reads hit the disk

Each (tier, direction) is timed at several sizes, `repeats` rounds of every size in turn, and
`fit_tiers` fits the α-β line of a one-message transfer (t = α + n·β, `toolkit.cost.fit`).
Files go to a private temporary folder that is removed before returning, whatever happens.
"""

from __future__ import annotations

import tempfile
import time
from typing import Any, Sequence

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from .. import comm
from ..cost import AlphaBeta, Sample, fit_alpha_beta
from ..cost.offload import TierLink
from ..data_parallel.zero import ShardedOptimizer
from ..launch import device as rank_device
from ..launch import spawn
from ..memory.measured import held_model_states
from ..models import TinyMLP, make_regression_data
from ..offload import OffloadOptimizer, StepStats, ThrottledStore, make_store, offloaded
# One intra-op thread while timing: a copy split over threads waits for the slowest, and on a
# loaded 2-core machine a descheduled thread adds a time slice (ms) to a transfer of µs.
from .roofline import one_thread

TIER_CASES = ("cpu", "nvme", "nvme cold")
"""Tiers measured by `measure_tiers` (module docstring)."""
BATCH = 24
"""Samples per step in `run_sharded`, split evenly over 1, 2, 3 or 4 ranks."""
SIZES = (1 << 18, 1 << 20, 1 << 22)
"""Default transfer sizes, bytes: 256 KiB, 1 MiB, 4 MiB."""


def _store(case: str, folder: str | None):
    if case not in TIER_CASES:
        raise ValueError(f"tier must be one of {TIER_CASES}, got {case!r}")
    return make_store(case.split()[0], folder=folder, cold=case.endswith("cold"))


def _row(tier: str, direction: str, nbytes: int, times: list[float]) -> dict[str, Any]:
    q25, med, q75 = np.percentile(times, [25, 50, 75])
    return dict(tier=tier, direction=direction, nbytes=nbytes, seconds=float(med),
                q25=float(q25), q75=float(q75), n=len(times), gbps=nbytes / med / 1e9)


def measure_tiers(sizes: Sequence[int] = SIZES, *, repeats: int = 5,
                  tiers: Sequence[str] = TIER_CASES, arena: int = 64 << 20,
                  device: Any = "cpu") -> pd.DataFrame:
    """Median seconds (and quartiles) of a store write and read of each size in bytes, per tier;
    rows (tier, direction, nbytes, seconds, q25, q75, n, gbps), every trial in
    ``df.attrs["trials"]``. Each transfer takes the next slice of an `arena` of bytes (the
    store's tensor and the device's buffers alike), as the optimizer walks its chunks, so a
    slice is not still in the CPU's cache from the trial before (32 MiB of L3 here). Writes go
    first, so a cold read finds its slice on the disk."""
    numel = max(arena, 2 * max(sizes)) // 4
    src = torch.randn(numel, device=device)
    dst = src.clone()  # touched once here, so no trial pays for making its pages
    rows, trials = [], []
    with one_thread(), tempfile.TemporaryDirectory(prefix="offload-tiers-") as folder:
        for tier in tiers:
            store = _store(tier, folder)
            try:
                store.allocate("x", numel, torch.float32)
                store.write("x", 0, numel, src)  # first touch: the file's pages are made here
                times: dict[tuple[str, int], list[float]] = {}
                lo = 0
                for _ in range(repeats):
                    for nbytes in sizes:
                        n = nbytes // 4
                        lo = 0 if lo + n > numel else lo
                        for direction in ("write", "read"):
                            start = time.perf_counter()
                            if direction == "write":
                                store.write("x", lo, lo + n, src[lo:lo + n])
                            else:
                                store.read("x", lo, lo + n, dst[lo:lo + n])
                            seconds = time.perf_counter() - start
                            times.setdefault((direction, nbytes), []).append(seconds)
                            trials.append(dict(tier=tier, direction=direction, nbytes=nbytes,
                                               seconds=seconds))
                        lo += n
            finally:
                store.close()
            rows += [_row(tier, d, b, t) for (d, b), t in sorted(times.items())]
    table = pd.DataFrame(rows)
    table.attrs["trials"] = pd.DataFrame(trials)
    return table


def fit_link(nbytes: Sequence[float], seconds: Sequence[float]) -> AlphaBeta:
    """α and β of t = α + n·β by relative least squares (`fit_alpha_beta` on one-message
    transfers: a broadcast from one rank to one other has exactly that model)."""
    return fit_alpha_beta([Sample("broadcast", "linear", 2, float(b), float(s))
                           for b, s in zip(nbytes, seconds)]).link


def fit_tiers(table: pd.DataFrame) -> dict[str, TierLink]:
    """One `TierLink` per tier of a `measure_tiers` table (read and write fitted apart)."""
    links = {}
    for tier, rows in table.groupby("tier", sort=False):
        read, write = (rows[rows.direction == d] for d in ("read", "write"))
        links[tier] = TierLink(tier, fit_link(read.nbytes, read.seconds),
                               fit_link(write.nbytes, write.seconds))
    return links


def measure_update(chunk_sizes: Sequence[int] = (1 << 17, 1 << 18, 1 << 19), *,
                   numel: int = 1 << 22, steps: int = 3, device: Any = "cpu",
                   optimizer_class: type[torch.optim.Optimizer] = torch.optim.Adam,
                   **options: Any) -> pd.DataFrame:
    """Seconds of the update of one chunk, where it really runs: `OffloadOptimizer` steps on
    `numel` elements (host tier, no prefetch) in chunks of each size, every chunk's "update"
    span after the first step (which makes the states). Rows (numel: the chunk's elements,
    seconds: median, q25, q75, n). The parameter and gradient come from memory, not from a
    cache still warm from the trial before, as in a real step."""
    rows = []
    for size in chunk_sizes:
        stats = time_steps(numel, tier="cpu", chunk_numel=size, prefetch=False, steps=steps + 1,
                           device=device, optimizer_class=optimizer_class, **options)
        times = [s.end - s.start for step in stats[1:] for s in step.spans if s.kind == "update"]
        row = _row("device", "update", size, times)
        rows.append(dict(numel=size, seconds=row["seconds"], q25=row["q25"], q75=row["q75"],
                         n=row["n"]))
    return pd.DataFrame(rows)


def time_steps(numel: int, *, tier: str = "nvme", chunk_numel: int = 1 << 18,
               prefetch: bool = True, steps: int = 4, link: AlphaBeta | None = None,
               seed: int = 0, device: Any = "cpu",
               optimizer_class: type[torch.optim.Optimizer] = torch.optim.Adam,
               **options: Any) -> list[StepStats]:
    """`steps` steps of an `OffloadOptimizer` on one flat parameter of `numel` elements with
    random gradients, in a store of `tier` (a `TIER_CASES` name), behind an emulated `link`
    (`ThrottledStore`: every transfer takes at least α + n·β) when given; each step's stats."""
    gen = torch.Generator(device=device).manual_seed(seed)
    p = nn.Parameter(torch.randn(numel, generator=gen, device=device))
    out = []
    with one_thread(), tempfile.TemporaryDirectory(prefix="offload-steps-") as folder:
        store = _store(tier, folder)
        if link is not None:
            store = ThrottledStore(store, latency=link.alpha, bandwidth=link.bandwidth)
        with OffloadOptimizer([p], optimizer_class, store=store, chunk_numel=chunk_numel,
                              prefetch=prefetch, **options) as opt:
            for _ in range(steps):
                p.grad = torch.randn(numel, generator=gen, device=device)
                opt.step()
                out.append(opt.last_step)
    return out


def _sharded_rank(rank: int, world_size: int, folder: str, mlp: dict, steps: int, tier: str,
                  chunk_numel: int, prefetch: bool, lr: float) -> dict[str, Any]:
    x, y = make_regression_data(BATCH, mlp["d_in"], mlp["d_out"], device=rank_device())
    n = len(x) // world_size
    x, y = x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]
    models, opts = [], []
    for make in (offloaded(torch.optim.Adam, tier=tier, folder=folder, chunk_numel=chunk_numel,
                           prefetch=prefetch), torch.optim.Adam):
        model = TinyMLP(**mlp, device=rank_device())
        models.append(model)
        opts.append(ShardedOptimizer(model.parameters(), make, stage=2, lr=lr))
    stats = []
    sent: list[dict[str, int]] = [{}, {}]  # op → bytes this rank passed to it, per model
    for _ in range(steps):
        for model, opt, mine in zip(models, opts, sent):
            with comm.recording() as trace:
                opt.zero_grad()
                F.mse_loss(model(x), y).backward()
                opt.step()
            for e in trace.events:
                mine[e.op] = mine.get(e.op, 0) + e.nbytes
        stats.append(opts[0].optim.last_step)
    inner: OffloadOptimizer = opts[0].optim
    out = dict(rank=rank, shard_numel=opts[0].flats[0].shard_numel,
               chunks=[c.numel for c in inner.chunks], steps=stats,
               tier_bytes=inner.store.nbytes, device_buffer_bytes=inner.device_bytes,
               held_offloaded=held_model_states(models[0], opts[0]),
               held_in_memory=held_model_states(models[1], opts[1]),
               sent_offloaded=sent[0], sent_in_memory=sent[1],
               equal=all(torch.equal(a, b) for a, b in zip(*(m.parameters() for m in models))),
               params=[p.detach().cpu().clone() for p in models[0].parameters()])
    if tier == "nvme":
        out["file_bytes"] = inner.store.file_bytes()
    inner.close()
    return out


def run_sharded(world_size: int, *, mlp: dict | None = None, steps: int = 3, tier: str = "nvme",
                chunk_numel: int = 4096, prefetch: bool = True, lr: float = 1e-2,
                timeout: float = 60) -> list[dict[str, Any]]:
    """ZeRO-2 (`ShardedOptimizer`, stage 2) on `world_size` ranks with each rank's shard of Adam
    offloaded to `tier`, beside the same with in-memory Adam on the same data. Per rank: shard
    size, chunk sizes, each step's `StepStats`, bytes in the tier (and its files), the states
    held on the device (`held_model_states`) and the bytes passed to each collective over all
    steps (recorded: op → bytes) for both, whether their parameters are bitwise equal, and the
    offloaded model's final parameters."""
    mlp = mlp or dict(d_in=16, d_hidden=64, d_out=5, depth=2)
    with tempfile.TemporaryDirectory(prefix="offload-ranks-") as folder:
        return spawn(_sharded_rank, world_size, folder, mlp, steps, tier, chunk_numel, prefetch,
                     lr, timeout=timeout, echo=False)


__all__ = ["BATCH", "SIZES", "TIER_CASES", "fit_link", "fit_tiers", "measure_tiers",
           "measure_update", "one_thread", "run_sharded", "time_steps"]
