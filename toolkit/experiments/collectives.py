"""Time collectives on real ranks over a sweep of sizes, in the manner of nccl-tests.

    from toolkit.experiments.collectives import measure
    df = measure([("all_reduce", "ring"), ("all_reduce", "torch")],
                 sizes=[4096, 1 << 20], world_sizes=[2, 4])

One launch per world size runs every (collective, algorithm, size): `warmup` untimed calls, then
`repeats` timed trials. A trial starts right after a barrier and runs `k` calls back to back,
k chosen (the same on every rank) so that a trial lasts about `min_time` seconds: one 50 µs call
timed alone would mostly measure the barrier's ragged exit and the clock. A trial's time per call
is the slowest rank's (the collective is done when the last rank is), and the table keeps the
median over trials, which shrugs off the scheduler's hiccups on an oversubscribed laptop.

Buffers hold zeros, so a thousand back-to-back sums stay finite and cost what any sum costs.

Algorithm ``"torch"`` is torch's built-in for that collective (gloo or NCCL), the baseline.
Sizes are bytes of the full tensor, the nccl-tests convention: the all-reduce/broadcast/reduce
tensor, the reduce-scatter input, the all-gather output, the scatter/gather list in all.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable, Iterable, Sequence

import pandas as pd
import torch
import torch.distributed as dist

from .. import collectives as C
from ..cost.models import BUS_FACTOR, COEFFICIENTS, TORCH
from ..launch import device, spawn


# torch 2.13 renamed the tensor forms (the old names warn); older releases only have the old ones.
# Looked up at call time, so that toolkit.comm's recording wrappers are the ones called.
def _RS_TENSOR(out, inp):
    return (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(out, inp)


def _AG_TENSOR(out, inp):
    return (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(out, inp)


_MAX_CALLS = 200  # back-to-back calls in one trial, at most
COLUMNS = ["collective", "algorithm", "p", "nbytes", "numel", "dtype", "seconds", "min_seconds",
           "algbw", "busbw", "backend"]


def _elements(nbytes: int, dtype: torch.dtype, p: int, collective: str) -> int:
    size = torch.empty(0, dtype=dtype).element_size()
    n = max(1, nbytes // size)
    if collective in ("reduce_scatter", "all_gather", "scatter", "gather"):
        n = max(p, n - n % p)  # torch's tensor forms of these need p | n
    return n


def _runner(collective: str, algorithm: str, n: int, p: int, rank: int,
            dtype: torch.dtype, device: torch.device) -> Callable[[], object]:
    """A zero-argument function doing one call on buffers allocated once."""
    ours = algorithm != TORCH
    full = torch.zeros(n, dtype=dtype, device=device)
    piece = torch.zeros(n // p, dtype=dtype, device=device)
    pieces = None
    if collective in ("scatter", "gather") and rank == 0:
        pieces = [torch.zeros(n // p, dtype=dtype, device=device) for _ in range(p)]
    fn = C.get_algorithm(collective, algorithm) if ours and collective in C.ALGORITHMS else None
    calls: dict[str, Callable[[], object]] = {
        "all_reduce": (lambda: fn(full, check=False)) if ours else (lambda: dist.all_reduce(full)),
        "broadcast": ((lambda: fn(full, 0, check=False)) if ours
                      else (lambda: dist.broadcast(full, 0))),
        "reduce": (lambda: fn(full, 0, check=False)) if ours else (lambda: dist.reduce(full, 0)),
        "reduce_scatter": ((lambda: C.ring_reduce_scatter(piece, full, check=False)) if ours
                           else (lambda: _RS_TENSOR(piece, full))),
        "all_gather": ((lambda: C.ring_all_gather(full, piece, check=False)) if ours
                       else (lambda: _AG_TENSOR(full, piece))),
        "scatter": ((lambda: C.scatter(piece, pieces, 0, check=False)) if ours
                    else (lambda: dist.scatter(piece, pieces, src=0))),
        "gather": ((lambda: C.gather(piece, pieces, 0, check=False)) if ours
                   else (lambda: dist.gather(piece, pieces, dst=0))),
    }
    return calls[collective]


def _rank_sweep(rank: int, world_size: int, cases, sizes, dtype, warmup, repeats, min_time):
    """Inside a rank: per (collective, algorithm, size), (numel, this rank's seconds per call in
    each trial)."""
    dev, out = device(), {}
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def trial(run, k: int) -> float:
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        for _ in range(k):
            run()
        sync()
        return (time.perf_counter() - t0) / k

    for collective, algorithm in cases:
        for nbytes in sizes:
            n = _elements(nbytes, dtype, world_size, collective)
            run = _runner(collective, algorithm, n, world_size, rank, dtype, dev)
            # The last warm-up call estimates one call's time (the first pays cold caches).
            one = [trial(run, 1) for _ in range(max(1, warmup))][-1]
            # Every rank must run the same number of calls: agree on the slowest estimate.
            est = torch.tensor([one], dtype=torch.float64, device=dev)
            dist.all_reduce(est, op=dist.ReduceOp.MAX)
            k = max(1, min(_MAX_CALLS, math.ceil(min_time / max(est.item(), 1e-7))))
            out[(collective, algorithm, nbytes)] = (n, [trial(run, k) for _ in range(repeats)])
            del run
    return out, str(dist.get_backend())


def _validate(cases, sizes, world_sizes, repeats, warmup, min_time):
    cases = [tuple(c) for c in cases]
    for c in cases:
        if len(c) != 2:
            raise ValueError(f"measure: each case is (collective, algorithm), got {c!r}")
        collective, algorithm = c
        known = set(COEFFICIENTS.get(collective, {})) | {TORCH}
        if collective not in COEFFICIENTS:
            raise ValueError(f"measure: unknown collective {collective!r}; "
                             f"choose from {', '.join(COEFFICIENTS)}")
        if algorithm not in known:
            raise ValueError(f"measure: {collective} has no algorithm {algorithm!r}; "
                             f"choose from {', '.join(sorted(known))}")
    if not sizes or any(int(s) < 1 for s in sizes):
        raise ValueError(f"measure: sizes must be positive byte counts, got {list(sizes)}")
    if not world_sizes or any(int(p) < 2 for p in world_sizes):
        raise ValueError(f"measure: world sizes must be >= 2, got {list(world_sizes)}")
    if repeats < 1 or warmup < 0:
        raise ValueError(f"measure: repeats must be >= 1 and warmup >= 0, got {repeats}, {warmup}")
    if not 0 <= min_time <= 10:
        raise ValueError(f"measure(min_time={min_time}) must be between 0 and 10 seconds")
    return cases


def measure(cases: Iterable[tuple[str, str]], *, sizes: Sequence[int], world_sizes: Sequence[int],
            repeats: int = 5, warmup: int = 2, min_time: float = 0.005,
            dtype: torch.dtype = torch.float32,
            backend: str = "auto", timeout: float = 600, progress: bool = False):
    """Time each (collective, algorithm) at each size (bytes) and world size; a DataFrame.

    Columns: collective, algorithm, p, nbytes (actual bytes of the full tensor), numel, dtype,
    seconds (per call: median over trials of the slowest rank), min_seconds (fastest trial),
    algbw and busbw (bytes/s, nccl-tests definitions), backend. `min_time`: seconds one trial
    should last (more back-to-back calls for small sizes).

    Read a size as ``df["nbytes"]`` or through ``itertuples()``: on a row Series, ``row.nbytes``
    is pandas' own attribute (the row's memory), not this column.
    """
    cases = _validate(cases, sizes, world_sizes, repeats, warmup, min_time)
    sizes = [int(s) for s in sizes]
    rows = []
    for p in world_sizes:
        t0 = time.perf_counter()
        per_rank = spawn(_rank_sweep, int(p), cases, sizes, dtype, warmup, repeats, min_time,
                         backend=backend, timeout=timeout)
        backend_used = per_rank[0][1]
        for key, (n, _) in per_rank[0][0].items():
            collective, algorithm, _ = key
            slowest = [max(r[0][key][1][i] for r in per_rank) for i in range(repeats)]
            sec = statistics.median(slowest)
            nb = n * torch.empty(0, dtype=dtype).element_size()
            rows.append(dict(collective=collective, algorithm=algorithm, p=int(p), nbytes=nb,
                             numel=n, dtype=str(dtype).removeprefix("torch."), seconds=sec,
                             min_seconds=min(slowest), algbw=nb / sec,
                             busbw=nb / sec * BUS_FACTOR[collective](int(p)),
                             backend=backend_used))
        if progress:
            print(f"measured p={p}: {len(cases)} algorithms × {len(sizes)} sizes "
                  f"in {time.perf_counter() - t0:.1f} s", flush=True)
    return pd.DataFrame(rows, columns=COLUMNS)


__all__ = ["COLUMNS", "TORCH", "measure"]
