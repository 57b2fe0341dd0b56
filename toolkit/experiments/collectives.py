"""Time collectives on real ranks over a sweep of sizes, so that a ratio holds still.

    from toolkit.experiments.collectives import measure
    df = measure([("all_reduce", "sliced_ring"), ("all_reduce", "torch")],
                 sizes=[4096, 1 << 20], world_sizes=[2, 4])
    df[["algorithm", "p", "nbytes", "seconds", "ratio", "ratio_q25", "ratio_q75"]]

The method, in the manner of nccl-tests, made robust to a busy shared machine:

1. **One launch per world size**; every algorithm of a collective shares the same buffers (zeros,
   so a thousand back-to-back sums stay finite and cost what any sum costs).
2. **Warm-up**: `warmup` rounds of one call of each algorithm (first calls pay cold caches, page
   faults and gloo's connection set-up); the last one estimates a call's time.
3. **Trials**: a trial starts right after a barrier and runs k calls back to back, k the same on
   every rank and for every algorithm, chosen so that a trial of the fastest lasts about
   `min_time` (one 50 µs call timed alone would mostly measure the barrier's ragged exit). A
   trial's time per call is the *slowest* rank's: the collective is done when its last rank is.
4. **Alternation**: round i runs one trial of every algorithm, in an order rotated every round
   (A B, B A, A B, ...), so whatever else the machine does hits all of them alike, and the ratio
   of two algorithms is taken trial by trial (paired: `toolkit.cost.spread.paired_ratios`).
5. **Enough trials to state the spread**: at least `repeats` rounds, then more until the median
   ratio against the baseline (torch's built-in) is known to ±`tolerance` at 95 % confidence,
   or `max_repeats` rounds. Every rank holds the same (slowest-rank) times, so all stop together.

The table keeps per algorithm the median time per call (`seconds`), its interquartile range
(`q25_seconds`, `q75_seconds`) and fastest trial (`min_seconds`), and the median paired ratio to
the baseline with its interquartile range and 95 % confidence interval (`ratio`, `ratio_q25`,
`ratio_q75`, `ratio_lo`, `ratio_hi`). Each trial's times are in ``df.attrs["trials"]``.

Algorithm ``"torch"`` is torch's built-in for that collective (gloo or NCCL), the baseline. An
algorithm may carry keyword options, each after a colon, ``"sliced_ring:slice_bytes=65536"``
(passed to the toolkit function). Sizes are bytes of the full tensor, the nccl-tests convention: the
all-reduce/broadcast/reduce tensor, the reduce-scatter input, the all-gather output, the
scatter/gather list in all.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Iterable, Sequence

import pandas as pd
import torch
import torch.distributed as dist

from .. import collectives as C
from ..comm.flat import gather_into, reduce_scatter_into
from ..cost.models import BUS_FACTOR, COEFFICIENTS, TORCH, algorithms, split_label
from ..cost.spread import paired_ratios, spread
from ..launch import device, spawn


_MAX_CALLS = 200  # back-to-back calls in one trial, at most
COLUMNS = ["collective", "algorithm", "p", "nbytes", "numel", "dtype", "seconds", "q25_seconds",
           "q75_seconds", "min_seconds", "trials", "calls", "baseline", "ratio", "ratio_q25",
           "ratio_q75", "ratio_lo", "ratio_hi", "algbw", "busbw", "backend"]


def _elements(nbytes: int, dtype: torch.dtype, p: int, collective: str) -> int:
    size = dtype.itemsize  # bytes per element, with no tensor made on any device
    n = max(1, nbytes // size)
    if collective in ("reduce_scatter", "all_gather", "scatter", "gather"):
        n = max(p, n - n % p)  # torch's tensor forms of these need p | n
    return n


def _buffers(collective: str, n: int, p: int, rank: int, dtype: torch.dtype,
             device: torch.device) -> dict[str, Any]:
    """The tensors one call works on, allocated once and shared by every algorithm."""
    pieces = None
    if collective in ("scatter", "gather") and rank == 0:
        pieces = [torch.zeros(n // p, dtype=dtype, device=device) for _ in range(p)]
    return dict(full=torch.zeros(n, dtype=dtype, device=device),
                piece=torch.zeros(n // p, dtype=dtype, device=device), pieces=pieces)


def _runner(collective: str, label: str, b: dict[str, Any]) -> Callable[[], object]:
    """A zero-argument function doing one call of `label` on the buffers `b`."""
    name, kw = split_label(label)
    full, piece, pieces = b["full"], b["piece"], b["pieces"]
    if name == TORCH:
        return {"all_reduce": lambda: dist.all_reduce(full),
                "broadcast": lambda: dist.broadcast(full, 0),
                "reduce": lambda: dist.reduce(full, 0),
                "reduce_scatter": lambda: reduce_scatter_into(piece, full),
                "all_gather": lambda: gather_into(full, piece),
                "scatter": lambda: dist.scatter(piece, pieces, src=0),
                "gather": lambda: dist.gather(piece, pieces, dst=0)}[collective]
    if collective in ("scatter", "gather"):
        fn = C.scatter if collective == "scatter" else C.gather
        return lambda: fn(piece, pieces, 0, check=False, **kw)
    fn = C.get_algorithm(collective, name)
    return {"all_reduce": lambda: fn(full, check=False, **kw),
            "broadcast": lambda: fn(full, 0, check=False, **kw),
            "reduce": lambda: fn(full, 0, check=False, **kw),
            "reduce_scatter": lambda: fn(piece, full, check=False, **kw),
            "all_gather": lambda: fn(full, piece, check=False, **kw)}[collective]


def _settled(times: list[list[float]], base: int | None, tolerance: float) -> bool:
    """Every ratio to the baseline (or, without one, every time) has its median pinned."""
    if base is None:
        return all(spread(t).ci_rel <= tolerance for t in times)
    return all(spread(paired_ratios(t, times[base])).ci_rel <= tolerance
               for i, t in enumerate(times) if i != base)


def _rank_sweep(rank: int, world_size: int, cases, sizes, dtype, warmup: int, repeats: int,
                max_repeats: int, tolerance: float, min_time: float):
    """Inside a rank: {(collective, algorithm, size): (numel, calls per trial, slowest-rank
    seconds per call of each trial)}, and the backend."""
    dev, out = device(), {}
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def trial(run: Callable[[], object], k: int) -> float:
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        for _ in range(k):
            run()
        sync()
        return (time.perf_counter() - t0) / k

    def slowest(values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    collectives = list(dict.fromkeys(c for c, _ in cases))
    for collective in collectives:
        labels = [a for c, a in cases if c == collective]
        base = labels.index(TORCH) if TORCH in labels and len(labels) > 1 else None
        for nbytes in sizes:
            n = _elements(nbytes, dtype, world_size, collective)
            buffers = _buffers(collective, n, world_size, rank, dtype, dev)
            runs = [_runner(collective, label, buffers) for label in labels]
            est = [0.0] * len(runs)
            for _ in range(max(1, warmup)):
                est = [trial(run, 1) for run in runs]
            est = slowest(est)  # every rank must run the same number of calls
            k = max(1, min(_MAX_CALLS, math.ceil(min_time / max(min(est), 1e-7))))
            times: list[list[float]] = [[] for _ in runs]
            for i in range(max_repeats):
                order = [(j + i) % len(runs) for j in range(len(runs))]
                mine = [0.0] * len(runs)
                for j in order:
                    mine[j] = trial(runs[j], k)
                for j, t in enumerate(slowest(mine)):
                    times[j].append(t)
                if i + 1 >= repeats and _settled(times, base, tolerance):
                    break
            for label, t in zip(labels, times):
                out[(collective, label, nbytes)] = (n, k, t)
            del runs, buffers
    return out, str(dist.get_backend())


def _validate(cases, sizes, world_sizes, repeats, max_repeats, warmup, min_time, tolerance):
    cases = [tuple(c) for c in cases]
    for c in cases:
        if len(c) != 2:
            raise ValueError(f"measure: each case is (collective, algorithm), got {c!r}")
        collective, label = c
        if collective not in COEFFICIENTS:
            raise ValueError(f"measure: unknown collective {collective!r}; "
                             f"choose from {', '.join(COEFFICIENTS)}")
        known = set(algorithms(collective)) | {TORCH}
        name, options = split_label(label)
        if name not in known:
            raise ValueError(f"measure: {collective} has no algorithm {name!r}; "
                             f"choose from {', '.join(sorted(known))}")
        if options and name == TORCH:
            raise ValueError(f"measure: {label!r}: torch's built-in takes no options")
    if len(set(cases)) != len(cases):
        raise ValueError(f"measure: a case is listed twice in {cases}")
    if not sizes or any(int(s) < 1 for s in sizes):
        raise ValueError(f"measure: sizes must be positive byte counts, got {list(sizes)}")
    if not world_sizes or any(int(p) < 2 for p in world_sizes):
        raise ValueError(f"measure: world sizes must be >= 2, got {list(world_sizes)}")
    if repeats < 1 or warmup < 0 or max_repeats < repeats:
        raise ValueError(f"measure: need repeats >= 1, max_repeats >= repeats and warmup >= 0; "
                         f"got repeats={repeats}, max_repeats={max_repeats}, warmup={warmup}")
    if not 0 <= min_time <= 10:
        raise ValueError(f"measure(min_time={min_time}) must be between 0 and 10 seconds")
    if not tolerance > 0:
        raise ValueError(f"measure(tolerance={tolerance}) must be > 0 (e.g. 0.03 for ±3 %)")
    return cases


def _rows(per_rank, p: int, dtype: torch.dtype, backend: str, trials: dict) -> list[dict]:
    """Table rows of one launch: spreads of each algorithm and of its ratio to the baseline."""
    data = per_rank[0][0]  # every rank holds the same slowest-rank times
    esize = dtype.itemsize
    rows = []
    for (collective, label, nbytes), (n, k, t) in data.items():
        base_key = (collective, TORCH, nbytes)
        has_base = base_key in data and label != TORCH
        s = spread(t)
        r = spread(paired_ratios(t, data[base_key][2])) if has_base else None
        nb = n * esize
        trials[(collective, label, p, nb)] = list(t)
        rows.append(dict(
            collective=collective, algorithm=label, p=p, nbytes=nb, numel=n,
            dtype=str(dtype).removeprefix("torch."), seconds=s.median, q25_seconds=s.q25,
            q75_seconds=s.q75, min_seconds=min(t), trials=len(t), calls=k,
            baseline=TORCH if has_base else "",
            ratio=r.median if r else math.nan, ratio_q25=r.q25 if r else math.nan,
            ratio_q75=r.q75 if r else math.nan, ratio_lo=r.lo if r else math.nan,
            ratio_hi=r.hi if r else math.nan, algbw=nb / s.median,
            busbw=nb / s.median * BUS_FACTOR[collective](p), backend=backend))
    return rows


def measure(cases: Iterable[tuple[str, str]], *, sizes: Sequence[int], world_sizes: Sequence[int],
            repeats: int = 5, max_repeats: int | None = None, tolerance: float = 0.03,
            warmup: int = 2, min_time: float = 0.005, dtype: torch.dtype = torch.float32,
            backend: str = "auto", device: str | None = None, timeout: float = 600,
            progress: bool = False):
    """Time each (collective, algorithm) at each size (bytes) and world size; a DataFrame.

    `repeats`: rounds of alternating trials at least; `max_repeats` (default `repeats`): at most,
    stopping once every median ratio to torch's built-in is known to ±`tolerance` (95 %).
    `min_time`: seconds one trial should last (more back-to-back calls for small sizes).
    Columns: see the module docstring; seconds are per call, algbw and busbw bytes/s
    (nccl-tests definitions). Read a size as ``df["nbytes"]`` or through ``itertuples()``: on a
    row Series, ``row.nbytes`` is pandas' own attribute (the row's memory), not this column.
    `backend` and `device` place the ranks as `toolkit.launch.spawn` does (``device="cuda"``
    with fewer GPUs than ranks: gloo on shared GPUs).
    """
    max_repeats = repeats if max_repeats is None else max_repeats
    cases = _validate(cases, sizes, world_sizes, repeats, max_repeats, warmup, min_time,
                      tolerance)
    sizes = [int(s) for s in sizes]
    rows: list[dict] = []
    trials: dict = {}
    for p in world_sizes:
        t0 = time.perf_counter()
        per_rank = spawn(_rank_sweep, int(p), cases, sizes, dtype, warmup, repeats, max_repeats,
                         tolerance, min_time, backend=backend, device=device, timeout=timeout)
        rows += _rows(per_rank, int(p), dtype, per_rank[0][1], trials)
        if progress:
            print(f"measured p={p}: {len(cases)} algorithms × {len(sizes)} sizes "
                  f"in {time.perf_counter() - t0:.1f} s", flush=True)
    df = pd.DataFrame(rows, columns=COLUMNS)
    df.attrs["trials"] = trials
    return df
