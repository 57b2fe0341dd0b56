"""`torch.profiler` Chrome traces as tables: each rank's events parsed, merged onto one clock,
split into compute and communication, and summed per operator.

A trace is the JSON that ``prof.export_chrome_trace(path)`` writes (the Trace Event Format,
"complete" events ``ph == "X"`` with ``ts`` and ``dur`` in µs). Time: ``baseTimeNanoseconds`` +
``ts`` is wall-clock time since the epoch, the clock of `time.time()`, so the traces of ranks on
one host, and `toolkit.comm`'s recorded events, line up without shifting (`spans`).

Kinds (`classify`): **comm** is the backend doing a collective (gloo's ``gloo:all_reduce`` on
its own worker thread, ``nccl:*`` annotations, NCCL kernels on a GPU); **launch** is the call
that hands it over (``c10d::allreduce_`` on the calling thread); **compute** is an ATen operator
(``aten::*``) on the host, or a GPU kernel; **copy** a GPU memcpy; the rest (autograd wrappers,
user annotations) is **other**.

Overlap and bottlenecks: `toolkit.viz.overlap`. Pure functions: no processes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

__all__ = ["COPY_OPS", "Span", "classify", "merge_traces", "merged_chrome_trace", "op_table",
           "read_trace", "spans", "trace_rank"]

COPY_OPS = frozenset({"aten::to", "aten::_to_copy", "aten::copy_", "aten::clone",
                      "aten::contiguous"})
"""ATen operators that copy a tensor (to another device, dtype or layout, or in place)."""
_ELEMENT_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "int": 4,
                  "long int": 8, "short int": 2, "signed char": 1, "unsigned char": 1,
                  "bool": 1}
"""Bytes per element of the profiler's ``Input type`` names (record_shapes=True)."""


@dataclass(frozen=True, slots=True)
class Span:
    """One complete event of a rank's trace, on the epoch clock."""

    rank: int
    name: str
    kind: str
    """``"compute"``, ``"comm"``, ``"launch"``, ``"copy"`` or ``"other"`` (`classify`)."""
    start: float
    """Seconds since the epoch (`time.time()`'s clock)."""
    end: float
    thread: str
    """``"pid/tid"`` of the thread that ran it (a GPU stream for kernels)."""
    category: str
    """The profiler's category: ``cpu_op``, ``user_annotation``, ``kernel`` (GPU), ..."""
    parent: str | None
    """Innermost enclosing operator (``cpu_op``) on the same thread, None at the top."""
    depth: int
    """Enclosing compute or launch spans on the same thread (0: outermost operator)."""
    self_time: float
    """Seconds not spent in the spans nested directly inside it."""
    nbytes: int = 0
    """comm: bytes of its first input tensor (shape × element size); 0 when not recorded."""

    @property
    def duration(self) -> float:
        return self.end - self.start


def read_trace(path: str | Path) -> dict:
    """The JSON of one Chrome trace file (what ``export_chrome_trace`` wrote)."""
    with open(path, encoding="utf-8") as f:
        trace = json.load(f)
    if not isinstance(trace, dict) or "traceEvents" not in trace:
        raise ValueError(f"read_trace: {path} is not a Chrome trace (no 'traceEvents'); pass "
                         "a file written by torch.profiler's export_chrome_trace")
    return trace


def trace_rank(trace: Mapping) -> int:
    """The rank that wrote `trace` (its ``distributedInfo``, present when a process group was
    initialised while profiling)."""
    info = trace.get("distributedInfo") or {}
    if "rank" not in info:
        raise ValueError("trace_rank: the trace has no distributedInfo.rank; profile inside an "
                         "initialised process group, or pass rank= to spans()")
    return int(info["rank"])


def classify(name: str, category: str | None) -> str:
    """The kind of an event from its name and category (module docstring)."""
    low = name.lower()
    if low.startswith(("gloo:", "nccl:")) or (category == "kernel" and "nccl" in low):
        return "comm"
    if name.startswith("c10d::") or name == "record_param_comms":
        return "launch"
    if category == "kernel":
        return "compute"
    if category == "gpu_memcpy":
        return "copy"
    if category == "cpu_op" and name.startswith("aten::"):
        return "compute"
    return "other"


def _nbytes(args: Mapping) -> int:
    dims, types = args.get("Input Dims") or [], args.get("Input type") or []
    if not dims or not types or not isinstance(dims[0], list):
        return 0
    elements = 1
    for d in dims[0]:
        elements *= int(d)
    return elements * _ELEMENT_BYTES.get(types[0], 0)


def spans(trace: Mapping, *, rank: int | None = None) -> list[Span]:
    """Every complete event of `trace` as a `Span` of `rank` (default: `trace_rank`), in start
    order; the profiler's own bracket (category ``Trace``) is left out."""
    rank = trace_rank(trace) if rank is None else rank
    base = float(trace.get("baseTimeNanoseconds", 0)) / 1e9
    events = [e for e in trace["traceEvents"]
              if e.get("ph") == "X" and e.get("cat") != "Trace" and "dur" in e]
    by_thread: dict[str, list[dict]] = {}
    for e in events:
        by_thread.setdefault(f"{e.get('pid')}/{e.get('tid')}", []).append(e)
    out = []
    for thread, evs in by_thread.items():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        # Enclosing events first (earlier start, longer first): a stack of the open ones gives
        # each event its parent, its depth, and its parent the time spent in children.
        stack: list[list] = []  # [event, kind, parent, depth, µs in children]
        done = []
        for e in evs:
            while stack and e["ts"] >= stack[-1][0]["ts"] + stack[-1][0]["dur"]:
                done.append(stack.pop())
            kind = classify(e.get("name", ""), e.get("cat"))
            parent = next((o[0]["name"] for o in reversed(stack) if o[0].get("cat") == "cpu_op"),
                          None)
            depth = sum(o[1] in ("compute", "launch") for o in stack)
            if stack:
                stack[-1][4] += e["dur"]
            stack.append([e, kind, parent, depth, 0.0])
        done += stack
        for e, kind, parent, depth, children in done:
            start = base + e["ts"] / 1e6
            out.append(Span(rank, e.get("name", ""), kind, start, start + e["dur"] / 1e6,
                            thread, str(e.get("cat")), parent, depth,
                            max(e["dur"] - children, 0.0) / 1e6,
                            _nbytes(e.get("args") or {}) if kind == "comm" else 0))
    return sorted(out, key=lambda s: (s.start, -s.end))


def merge_traces(traces: Iterable[Mapping]) -> list[Span]:
    """The spans of every rank's trace on one clock, in start order; each trace's rank is read
    from it, and two traces of one rank are an error."""
    merged, seen = [], set()
    for trace in traces:
        r = trace_rank(trace)
        if r in seen:
            raise ValueError(f"merge_traces: two traces of rank {r}; pass one trace per rank")
        seen.add(r)
        merged += spans(trace, rank=r)
    return sorted(merged, key=lambda s: (s.start, -s.end))


def merged_chrome_trace(traces: Iterable[Mapping]) -> dict:
    """One Chrome trace holding every rank's events, each rank a process named "rank r", on a
    common time origin (open it in https://ui.perfetto.dev or chrome://tracing)."""
    traces = list(traces)
    bases = [float(t.get("baseTimeNanoseconds", 0)) / 1e3 for t in traces]  # µs
    origin = min(b + min((e["ts"] for e in t["traceEvents"] if "ts" in e
                          and isinstance(e["ts"], (int, float))), default=0.0)
                 for b, t in zip(bases, traces))
    events: list[dict] = []
    for base, trace in zip(bases, traces):
        r = trace_rank(trace)
        events.append({"ph": "M", "name": "process_name", "pid": r, "tid": 0,
                       "args": {"name": f"rank {r}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0,
                       "args": {"sort_index": r}})
        for e in trace["traceEvents"]:
            if e.get("cat") == "Trace" or not isinstance(e.get("pid"), int):
                continue  # the profiler's own bracket and its global markers
            if e.get("ph") == "M" and e.get("name") in ("process_name", "process_sort_index",
                                                        "process_labels"):
                continue
            moved = dict(e, pid=r)
            if isinstance(e.get("ts"), (int, float)):
                moved["ts"] = base + e["ts"] - origin
            events.append(moved)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"ranks": sorted(trace_rank(t) for t in traces)}}


def op_table(all_spans: Iterable[Span], *, rank: int | None = None) -> list[dict]:
    """One row per operator name (of one rank, or all): kind, calls, calls at the top of the
    host's stack (``parent`` None: issued straight from Python), total and self seconds;
    sorted by self time, largest first."""
    rows: dict[str, dict] = {}
    for s in all_spans:
        if rank is not None and s.rank != rank:
            continue
        row = rows.setdefault(s.name, {"name": s.name, "kind": s.kind, "calls": 0,
                                       "top-level calls": 0, "total": 0.0, "self": 0.0})
        row["calls"] += 1
        row["top-level calls"] += s.parent is None
        row["total"] += s.duration
        row["self"] += s.self_time
    return sorted(rows.values(), key=lambda r: -r["self"])
