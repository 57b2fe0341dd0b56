"""Who holds the memory: allocator actions replayed into a live-bytes timeline, its peak, and the
allocations live at the peak grouped by who made them; from either of torch's two records.

* **The profiler's memory events** (any device; the CPU's here): ``torch.profiler.profile(
  profile_memory=True)`` writes an instant event ``[memory]`` per allocation and free into the
  Chrome trace, with ``Addr``, ``Bytes`` (negative for a free), ``Total Allocated``, ``Device
  Type`` (0 CPU, 1 CUDA) and ``Device Id`` (`profiler_allocations`). The profiler only knows the
  blocks allocated while it recorded: a free of an older block is not reported, so the replay
  counts what the profiled window allocated on top of what already lived (the parameters).
  Who made an allocation: the innermost operator (``cpu_op``) and the outermost annotation
  (``record_function``, e.g. "forward") enclosing the event on its thread.
* **A CUDA memory snapshot** (``torch.cuda.memory._record_memory_history()``, then
  ``torch.cuda.memory._snapshot()``; the format is documented in ``torch/cuda/memory.py``):
  ``segments``, each one ``cudaMalloc`` of the caching allocator (``total_size``, ``stream``,
  ``segment_type`` "small"/"large"), split into ``blocks`` whose ``state`` is
  ``active_allocated`` (a tensor's), ``active_pending_free`` (freed, but another stream may
  still use it) or ``inactive`` (cached: reserved from the GPU, free for reuse), each with the
  Python ``frames`` that allocated it; and ``device_traces``, the recorded history per device
  (``alloc``, ``free_requested``, ``free_completed``, ``segment_alloc``, ``segment_free``,
  ``oom``, ``snapshot``; ``addr``, ``size``, ``time_us``, ``frames``). `snapshot_allocations`
  replays the history (a block counts from ``alloc`` to ``free_completed``), `snapshot_summary`
  and `segment_table` read the state: reserved = Σ segment sizes; allocated, pending and cached
  free = Σ block sizes by state; the largest cached block bounds the biggest tensor the cache
  can give without another ``cudaMalloc``.

`replay` is the one algorithm both use: actions in time order, a block live from its
allocation to its free at the same address. Pure functions: no processes, no CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Iterable, Mapping, Sequence

import plotly.graph_objects as go

from .trace import spans, trace_rank

__all__ = ["Allocation", "Replay", "allocation_site", "memory_timeline", "profiler_allocations",
           "replay", "segment_table", "snapshot_allocations", "snapshot_summary"]

DEVICE_TYPES = {"cpu": 0, "cuda": 1}
"""c10's DeviceType numbers as the profiler writes them in ``Device Type``."""
_LIBRARY = ("/torch/", "<frozen ", "<string>")
"""Frames from these paths are the library's, not the caller's (`allocation_site`); so is
Python's standard library (under ``lib/pythonX.Y/`` but not in its site-packages)."""


@dataclass(frozen=True, slots=True)
class Allocation:
    """One allocator action: `size` bytes taken (> 0) or given back (< 0) at `addr`."""

    time: float
    """Seconds (the profiler's: since the epoch; a snapshot's: its ``time_us`` / 1e6)."""
    addr: int
    size: int
    site: str
    """Who allocated it (for a free: who allocated the block it frees, when known)."""
    thread: str = ""


@dataclass
class Replay:
    """Live bytes over time from a sequence of `Allocation` (`replay`)."""

    times: list[float]
    live: list[int]
    """Bytes live after each action, in `times` order."""
    peak: int
    peak_time: float
    at_peak: list[Allocation] = field(default_factory=list)
    """The allocations live at the peak (each block once, with its size and site)."""
    unmatched_free: int = 0
    """Bytes freed at addresses not allocated in the replayed window (older blocks)."""

    def by_site(self) -> list[dict]:
        """The blocks live at the peak grouped by site: bytes, blocks, share; largest first."""
        rows: dict[str, dict] = {}
        for a in self.at_peak:
            row = rows.setdefault(a.site, {"site": a.site, "bytes": 0, "blocks": 0})
            row["bytes"] += a.size
            row["blocks"] += 1
        for row in rows.values():
            row["share"] = row["bytes"] / self.peak if self.peak else 0.0
        return sorted(rows.values(), key=lambda r: -r["bytes"])


def replay(actions: Iterable[Allocation]) -> Replay:
    """Live bytes after each action (sorted by time; ties keep their order), the peak, and
    what is live at the first moment of the peak. A free matches the live block at its
    address; a free of an unknown address counts in ``unmatched_free`` and changes nothing."""
    live: dict[int, Allocation] = {}
    total, peak, peak_time, at_peak, unmatched = 0, 0, 0.0, [], 0
    times, series = [], []
    ordered = sorted(enumerate(actions), key=lambda ia: (ia[1].time, ia[0]))
    if ordered:
        peak_time = ordered[0][1].time
    for _, a in ordered:
        if a.size > 0:
            if a.addr in live:  # the allocator reused an address whose free was not seen
                total -= live[a.addr].size
            live[a.addr] = a
            total += a.size
        elif a.size < 0:
            block = live.pop(a.addr, None)
            if block is None:
                unmatched += -a.size
            else:
                total -= block.size
        times.append(a.time)
        series.append(total)
        if total > peak:
            peak, peak_time, at_peak = total, a.time, list(live.values())
    return Replay(times, series, peak, peak_time, at_peak, unmatched)


def _enclosing(trace: Mapping, rank: int) -> dict[str, list]:
    """Per thread, the spans that can enclose a memory event: (start, end, category, name)."""
    out: dict[str, list] = {}
    for s in spans(trace, rank=rank):
        if s.category in ("cpu_op", "user_annotation"):
            out.setdefault(s.thread, []).append((s.start, s.end, s.category, s.name))
    return out


def _site(candidates: Sequence[tuple], t: float) -> str:
    inside = [c for c in candidates if c[0] <= t <= c[1]]
    ops = [c for c in inside if c[2] == "cpu_op"]
    phases = [c for c in inside if c[2] == "user_annotation"]
    op = max(ops, key=lambda c: (c[0], -c[1]))[3] if ops else "(no operator)"
    phase = min(phases, key=lambda c: (c[0], -c[1]))[3] if phases else ""
    return f"{phase} · {op}" if phase else op


def profiler_allocations(trace: Mapping, *, rank: int | None = None, device: str = "cpu",
                         device_id: int | None = None) -> list[Allocation]:
    """The ``[memory]`` events of one rank's Chrome trace for `device` ("cpu" or "cuda"; and
    `device_id` when given), as `Allocation` with their site (module docstring), in time
    order. A trace profiled without ``profile_memory=True`` has none: an error says so."""
    if device not in DEVICE_TYPES:
        raise ValueError(f"profiler_allocations: device must be one of {list(DEVICE_TYPES)}, "
                         f"got {device!r}")
    rank = trace_rank(trace) if rank is None else rank
    events = [e for e in trace["traceEvents"] if e.get("name") == "[memory]"]
    if not events:
        raise ValueError("profiler_allocations: the trace has no [memory] events; profile with "
                         "torch.profiler.profile(profile_memory=True)")
    base = float(trace.get("baseTimeNanoseconds", 0)) / 1e9
    around = _enclosing(trace, rank)
    out = []
    for e in events:
        args = e.get("args") or {}
        if int(args.get("Device Type", -1)) != DEVICE_TYPES[device]:
            continue
        if device_id is not None and int(args.get("Device Id", -1)) != device_id:
            continue
        thread, t = f"{e.get('pid')}/{e.get('tid')}", base + float(e["ts"]) / 1e6
        out.append(Allocation(t, int(args["Addr"]), int(args["Bytes"]),
                              _site(around.get(thread, ()), t), thread))
    return sorted(out, key=lambda a: a.time)


def allocation_site(frames: Sequence[Mapping], *, skip: Sequence[str] = _LIBRARY) -> str:
    """The innermost frame of a snapshot's ``frames`` (innermost first, as torch records
    them) that is not library code: ``"file.py:line function"``; "(no frames)" without any,
    the innermost frame when every frame is the library's."""
    if not frames:
        return "(no frames)"

    def library(filename: str) -> bool:
        stdlib = "/lib/python3" in filename and "-packages/" not in filename
        return stdlib or any(p in filename for p in skip)

    chosen = next((f for f in frames if not library(str(f.get("filename", "")))), frames[0])
    return f"{PurePath(str(chosen.get('filename', '?'))).name}:{chosen.get('line', '?')} " \
           f"{chosen.get('name', '?')}"


def snapshot_allocations(snapshot: Mapping, *, device: int = 0) -> list[Allocation]:
    """The recorded history of `device` in a CUDA snapshot as `Allocation`: ``alloc`` takes a
    block, ``free_completed`` gives it back (``free_requested`` only marks it pending; segment
    actions move reserved memory, not allocated). Time is ``time_us`` / 1e6 where recorded,
    else the entry's position."""
    traces = snapshot.get("device_traces") or []
    if device >= len(traces):
        raise ValueError(f"snapshot_allocations: the snapshot has device_traces for "
                         f"{len(traces)} device(s), not device {device}; record with "
                         "torch.cuda.memory._record_memory_history() before the work")
    out = []
    for i, e in enumerate(traces[device]):
        action = e.get("action")
        if action not in ("alloc", "free_completed"):
            continue
        t = float(e["time_us"]) / 1e6 if "time_us" in e else float(i)
        size = int(e["size"]) if action == "alloc" else -int(e["size"])
        out.append(Allocation(t, int(e["addr"]), size, allocation_site(e.get("frames") or []),
                              f"stream {e.get('stream', 0)}"))
    return out


_PENDING = ("active_pending_free", "active_awaiting_free")  # the C++ and the docstring's names


def segment_table(snapshot: Mapping) -> list[dict]:
    """One row per segment: device, stream, type, its size and its bytes by block state."""
    rows = []
    for seg in snapshot.get("segments", []):
        blocks = seg.get("blocks", [])
        by = {"active_allocated": 0, "pending free": 0, "inactive": 0}
        largest_free = 0
        for b in blocks:
            state = "pending free" if b.get("state") in _PENDING else b.get("state")
            by[state] = by.get(state, 0) + int(b["size"])
            if state == "inactive":
                largest_free = max(largest_free, int(b["size"]))
        rows.append({"device": seg.get("device", 0), "stream": seg.get("stream", 0),
                     "type": seg.get("segment_type", "?"), "size": int(seg["total_size"]),
                     "blocks": len(blocks), "allocated": by["active_allocated"],
                     "pending free": by["pending free"], "cached free": by["inactive"],
                     "largest free block": largest_free})
    return rows


def snapshot_summary(snapshot: Mapping) -> dict[str, int]:
    """The allocator's state in a snapshot: segments, reserved, allocated, pending free, cached
    free and the largest free block (bytes); reserved = allocated + pending + cached."""
    rows = segment_table(snapshot)
    return {"segments": len(rows), "reserved": sum(r["size"] for r in rows),
            "allocated": sum(r["allocated"] for r in rows),
            "pending free": sum(r["pending free"] for r in rows),
            "cached free": sum(r["cached free"] for r in rows),
            "largest free block": max((r["largest free block"] for r in rows), default=0),
            "blocks": sum(r["blocks"] for r in rows)}


def memory_timeline(replays: Mapping[str, Replay], *,
                    title: str = "bytes allocated during the step") -> go.Figure:
    """One step line per replay (e.g. per rank) of the live bytes, in MiB against ms since the
    earliest action, each peak marked with its three largest sites in the hover."""
    if not replays or not any(r.times for r in replays.values()):
        raise ValueError("memory_timeline: nothing to draw; pass {label: replay(...)} with "
                         "at least one action")
    t0 = min(r.times[0] for r in replays.values() if r.times)
    fig = go.Figure()
    for label, r in replays.items():
        if not r.times:
            continue
        fig.add_trace(go.Scatter(x=[(t - t0) * 1e3 for t in r.times],
                                 y=[b / 2**20 for b in r.live], mode="lines",
                                 line=dict(shape="hv"), name=label,
                                 hovertemplate=f"{label}: %{{y:.2f}} MiB at %{{x:.2f}} ms"
                                               "<extra></extra>"))
        top = "<br>".join(f"{row['site']}: {row['bytes'] / 2**20:.2f} MiB"
                          for row in r.by_site()[:3])
        fig.add_trace(go.Scatter(x=[(r.peak_time - t0) * 1e3], y=[r.peak / 2**20],
                                 mode="markers", marker=dict(size=11, symbol="star"),
                                 name=f"{label} peak", hovertext=[top],
                                 hovertemplate=f"{label} peak %{{y:.2f}} MiB<br>%{{hovertext}}"
                                               "<extra></extra>"))
    fig.update_layout(title=title, height=380, xaxis_title="ms since the first allocation",
                      yaxis_title="MiB live (allocated in the window)",
                      legend=dict(orientation="h", y=-0.25), margin=dict(t=60, b=40))
    return fig
