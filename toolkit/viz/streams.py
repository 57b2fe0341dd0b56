"""A GPU's side of a `torch.profiler` trace: kernels per CUDA stream, NCCL's kernels, the gaps
where the device ran nothing and why; and the same gaps on a CPU rank's own thread.

Kineto writes every GPU activity as a complete event (``ph == "X"``) with ``pid`` = the device
and ``tid`` = the stream: category ``kernel`` (NCCL's are named ``ncclDevKernel_*`` or
``ncclKernel_*``), ``gpu_memcpy``, ``gpu_memset``; ``args`` hold ``device``, ``stream`` and
``correlation``. The host call that queued it (``cudaLaunchKernel``, ``cudaMemcpyAsync``,
``cuLaunchKernel``...: category ``cuda_runtime`` or ``cuda_driver``) carries the same
``correlation`` (`device_ops` pairs them). ProcessGroupNCCL runs its collectives on a stream of
its own, so an overlapped all-reduce is an NCCL kernel on one stream under compute kernels on
another.

**Gaps** (`device_gaps`): stretches in which no stream of a device runs anything. Each is
charged to the op that ends it: **launch** if that op's host call returned only after the gap
had begun (the GPU had nothing queued: it waited for the host, the "launch-bound" step of small
kernels), **dependency** if the op was already queued (it waited for something else: another
stream's event, a synchronisation, a peer's NCCL kernel). The CPU counterpart (`host_gaps`):
on a rank's main thread, the stretches between consecutive top-level operators, where the
thread ran Python, autograd's engine or hooks instead of an operator (or, on a shared machine,
was not running at all): the host's cost per operator, which on a GPU shows as launch gaps
once kernels are shorter than it.

Pure functions over trace dictionaries (tested on synthetic ones shaped like Kineto's); the
overlap arithmetic is `toolkit.viz.overlap`'s.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import plotly.graph_objects as go

from .overlap import overlap, union
from .trace import Span, trace_rank

__all__ = ["DeviceOp", "device_gaps", "device_ops", "device_overlap", "gap_summary",
           "host_gaps", "idle_gaps", "is_nccl", "stream_table", "stream_timeline"]

DEVICE_KINDS = {"kernel": "compute", "gpu_memcpy": "copy", "gpu_memset": "memset"}
"""Kineto's categories of device activity → the kind `DeviceOp` gives them (NCCL: "comm")."""
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")


def is_nccl(name: str) -> bool:
    """Whether a kernel's name is one of NCCL's (``ncclDevKernel_AllReduce_Sum_f32_RING_LL``,
    ``ncclKernel_...``)."""
    return name.lower().startswith("nccl")


@dataclass(frozen=True, slots=True)
class DeviceOp:
    """One kernel, copy or memset on a GPU, with the host call that queued it."""

    rank: int
    name: str
    kind: str
    """``"compute"``, ``"comm"`` (an NCCL kernel), ``"copy"`` or ``"memset"``."""
    device: int
    stream: int
    start: float
    """Seconds since the epoch, as every span of `toolkit.viz.trace`."""
    end: float
    correlation: int | None
    launch: str | None = None
    """The host call that queued it (``cudaLaunchKernel``...), None when not in the trace."""
    launch_start: float | None = None
    launch_end: float | None = None

    @property
    def duration(self) -> float:
        return self.end - self.start


def device_ops(trace: Mapping, *, rank: int | None = None) -> list[DeviceOp]:
    """Every kernel, copy and memset of one rank's trace with its launch (module docstring), in
    start order; [] for a trace profiled without CUDA activity."""
    rank = trace_rank(trace) if rank is None else rank
    base = float(trace.get("baseTimeNanoseconds", 0)) / 1e9
    launches: dict[int, dict] = {}
    for e in trace["traceEvents"]:
        corr = (e.get("args") or {}).get("correlation")
        if e.get("ph") == "X" and e.get("cat") in LAUNCH_CATEGORIES and corr is not None:
            launches[int(corr)] = e
    out = []
    for e in trace["traceEvents"]:
        if e.get("ph") != "X" or e.get("cat") not in DEVICE_KINDS:
            continue
        args = e.get("args") or {}
        name = str(e.get("name", ""))
        kind = "comm" if e["cat"] == "kernel" and is_nccl(name) else DEVICE_KINDS[e["cat"]]
        corr = args.get("correlation")
        host = launches.get(int(corr)) if corr is not None else None
        start = base + float(e["ts"]) / 1e6
        out.append(DeviceOp(
            rank, name, kind, int(args.get("device", e.get("pid", 0))),
            int(args.get("stream", e.get("tid", 0))), start, start + float(e["dur"]) / 1e6,
            int(corr) if corr is not None else None,
            host.get("name") if host else None,
            base + float(host["ts"]) / 1e6 if host else None,
            base + (float(host["ts"]) + float(host["dur"])) / 1e6 if host else None))
    return sorted(out, key=lambda o: (o.start, o.end))


def _length(intervals: Sequence[tuple[float, float]]) -> float:
    return sum(e - s for s, e in intervals)


def stream_table(ops: Iterable[DeviceOp]) -> list[dict]:
    """One row per (rank, device, stream): its kernels, NCCL kernels, copies, busy seconds (the
    union of its ops), its first and last op, and its most frequent kernel."""
    groups: dict[tuple[int, int, int], list[DeviceOp]] = {}
    for o in ops:
        groups.setdefault((o.rank, o.device, o.stream), []).append(o)
    rows = []
    for (rank, dev, stream), mine in sorted(groups.items()):
        names = Counter(o.name for o in mine if o.kind in ("compute", "comm"))
        rows.append({"rank": rank, "device": dev, "stream": stream,
                     "kernels": sum(o.kind in ("compute", "comm") for o in mine),
                     "nccl kernels": sum(o.kind == "comm" for o in mine),
                     "copies": sum(o.kind in ("copy", "memset") for o in mine),
                     "busy": _length(union((o.start, o.end) for o in mine)),
                     "first": min(o.start for o in mine), "last": max(o.end for o in mine),
                     "most frequent": names.most_common(1)[0][0] if names else ""})
    return rows


def idle_gaps(intervals: Iterable[tuple[float, float]], *,
              window: tuple[float, float] | None = None) -> list[tuple[float, float]]:
    """The stretches between the union of `intervals` ((start, end) pairs, any order), within
    `window` when given (its ends count as idle up to the first and from the last interval)."""
    pieces = union(intervals)
    edges = [(window[0], window[0])] if window else []
    edges += pieces + ([(window[1], window[1])] if window else [])
    return [(a[1], b[0]) for a, b in zip(edges, edges[1:]) if b[0] > a[1]]


def device_gaps(ops: Iterable[DeviceOp], *, rank: int, device: int | None = None,
                min_gap: float = 0.0) -> list[dict]:
    """The gaps longer than `min_gap` seconds in which no stream of one device of `rank` ran
    anything, each charged to the op that ends it (module docstring): start, seconds, the op
    before and after, cause ``"launch"``, ``"dependency"`` or ``"unknown"`` (launch not
    traced). `device`: the only one the rank used when None."""
    mine = [o for o in ops if o.rank == rank]
    devices = sorted({o.device for o in mine})
    if device is None:
        if len(devices) > 1:
            raise ValueError(f"device_gaps: rank {rank} used devices {devices}; pass device=")
        device = devices[0] if devices else 0
    mine = sorted((o for o in mine if o.device == device), key=lambda o: (o.start, o.end))
    rows, busy_until, before = [], None, None
    for o in mine:
        if busy_until is not None and o.start - busy_until > min_gap:
            cause = ("unknown" if o.launch_end is None else
                     "launch" if o.launch_end > busy_until else "dependency")
            rows.append({"start": busy_until, "gap": o.start - busy_until,
                         "after": before.name, "before": o.name, "stream": o.stream,
                         "cause": cause})
        if busy_until is None or o.end > busy_until:
            busy_until, before = o.end, o
    return rows


def gap_summary(gaps: Sequence[Mapping], *, window: float) -> dict[str, float]:
    """Seconds idle in `gaps` (rows of `device_gaps` or `host_gaps`) by cause, their number,
    and the idle share of a `window` of that many seconds."""
    if not window > 0:
        raise ValueError(f"gap_summary: window must be positive seconds, got {window}")
    by = Counter()
    for g in gaps:
        by[g.get("cause", "gap")] += g["gap"]
    total = sum(by.values())
    return {"gaps": len(gaps), "idle": total, "idle share": total / window,
            **{f"idle ({cause})": s for cause, s in sorted(by.items())}}


def device_overlap(ops: Iterable[DeviceOp]) -> list[dict]:
    """Per (rank, device): NCCL kernels against compute kernels (`toolkit.viz.overlap.overlap`:
    comm, hidden, exposed seconds, the hidden fraction), and the kernels' counts."""
    groups: dict[tuple[int, int], list[DeviceOp]] = {}
    for o in ops:
        groups.setdefault((o.rank, o.device), []).append(o)
    rows = []
    for (rank, dev), mine in sorted(groups.items()):
        comm = [(o.start, o.end) for o in mine if o.kind == "comm"]
        work = [(o.start, o.end) for o in mine if o.kind == "compute"]
        rows.append({"rank": rank, "device": dev, **overlap(comm, work),
                     "nccl kernels": len(comm), "compute kernels": len(work)})
    return rows


def host_gaps(all_spans: Iterable[Span], *, rank: int, min_gap: float = 0.0) -> list[dict]:
    """On the thread of `rank` that ran the most top-level operators (its main thread), the
    gaps longer than `min_gap` seconds between consecutive top-level operators (ATen ops and
    collective launches such as ``c10d::allreduce_``), from its first operator to its last:
    start, seconds, the operators before and after."""
    top = [s for s in all_spans if s.rank == rank and s.kind in ("compute", "launch")
           and s.depth == 0 and s.category == "cpu_op"]
    if not top:
        raise ValueError(f"host_gaps: rank {rank} has no top-level ATen operators in the spans")
    main = Counter(s.thread for s in top).most_common(1)[0][0]
    ops = sorted((s for s in top if s.thread == main), key=lambda s: (s.start, -s.end))
    rows, busy_until, before = [], None, None
    for s in ops:
        if busy_until is not None and s.start - busy_until > min_gap:
            rows.append({"start": busy_until, "gap": s.start - busy_until, "after": before.name,
                         "before": s.name, "thread": main, "cause": "host"})
        if busy_until is None or s.end > busy_until:
            busy_until, before = s.end, s
    return rows


_KIND_COLORS = {"compute": "#7f7f7f", "comm": "#9467bd", "copy": "#ff7f0e", "memset": "#ffbb78"}


def stream_timeline(ops: Sequence[DeviceOp], *,
                    gaps: Mapping[int, Sequence[Mapping]] | None = None,
                    title: str = "kernels per CUDA stream") -> go.Figure:
    """One row per (rank, stream): each kernel a bar (compute grey, NCCL purple, copies
    orange), and per rank a row of its device's gaps (`device_gaps` rows, by rank) coloured by
    cause. Time zero is the earliest op."""
    if not ops:
        raise ValueError("stream_timeline: no device ops (was the trace profiled with CUDA?)")
    t0 = min(o.start for o in ops)
    fig, rows = go.Figure(), []
    for rank, stream in sorted({(o.rank, o.stream) for o in ops}):
        mine = [o for o in ops if o.rank == rank and o.stream == stream]
        row = f"rank {rank} · stream {stream}"
        rows.append(row)
        fig.add_trace(go.Bar(orientation="h", y=[row] * len(mine),
                             base=[(o.start - t0) * 1e3 for o in mine],
                             x=[o.duration * 1e3 for o in mine],
                             marker=dict(color=[_KIND_COLORS[o.kind] for o in mine]),
                             customdata=[o.name[:80] for o in mine], showlegend=False,
                             hovertemplate="%{customdata}<br>%{x:.4f} ms<extra></extra>"))
    for rank, rank_gaps in sorted((gaps or {}).items()):
        if not rank_gaps:
            continue
        row = f"rank {rank} · idle"
        rows.append(row)
        fig.add_trace(go.Bar(orientation="h", y=[row] * len(rank_gaps),
                             base=[(g["start"] - t0) * 1e3 for g in rank_gaps],
                             x=[g["gap"] * 1e3 for g in rank_gaps],
                             marker=dict(color=["#d62728" if g["cause"] == "launch" else
                                                "#1f77b4" for g in rank_gaps]),
                             customdata=[g["cause"] for g in rank_gaps], showlegend=False,
                             hovertemplate="idle (%{customdata}): %{x:.4f} ms<extra></extra>"))
    fig.update_layout(title=title, barmode="overlay", height=160 + 40 * len(rows),
                      xaxis_title="ms since the first kernel",
                      yaxis=dict(categoryorder="array", categoryarray=rows[::-1]),
                      margin=dict(l=170, r=20, t=60, b=40))
    return fig
