"""Overlap of communication with computation, and the bottlenecks a profiled step shows, from
the spans of `toolkit.viz.trace` (or any (start, end) intervals).

Overlap (`overlap`, `overlap_table`): a rank's communication time is the union of its comm
intervals, its compute time the union of its compute intervals; the **hidden** part is their
intersection, the **exposed** part the rest of the communication, which the step waits for
(Li et al., "PyTorch Distributed", VLDB 2020, section 3.2.3: DDP overlaps the all-reduce of a
bucket with the backward of earlier layers to hide it). On a GPU the kernels are the compute;
the host's ATen calls only launch them. `recorded_overlap_table` reads the same from what lesson
04 records: `toolkit.comm`'s all-reduce events (from the call to its wait) against the
backward spans of gradient hooks.

`symptoms` / `diagnose` read the three bottlenecks of lesson 06's exercises from one rank's
spans: many copies issued one by one from the training loop; collectives launched only after
the last backward matmul (a blocking all-reduce: program order on one thread, which a busy
scheduler cannot change); as many all-reduces as gradient tensors (a bucket cap too small).
Pure functions: no processes.
"""

from __future__ import annotations

import statistics
from typing import Iterable, Mapping, Sequence

from ..comm.events import Event
from .trace import COPY_OPS, Span

__all__ = ["DIAGNOSES", "diagnose", "exposed_time", "overlap", "overlap_table",
           "recorded_overlap_table", "symptoms", "union"]

DIAGNOSES = ("copy in a loop", "blocking all-reduce", "bucket cap too small",
             "no bottleneck found")
"""What `diagnose` can answer."""


def union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Disjoint, sorted intervals covering the same time as `intervals` ((start, end) pairs)."""
    out: list[list[float]] = []
    for s, e in sorted((float(s), float(e)) for s, e in intervals):
        if e < s:
            raise ValueError(f"union: an interval ends before it starts: ({s}, {e})")
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _length(intervals: Sequence[tuple[float, float]]) -> float:
    return sum(e - s for s, e in intervals)


def _intersection(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> float:
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):  # both disjoint and sorted: one merge pass
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def overlap(comm: Iterable[tuple[float, float]],
            compute: Iterable[tuple[float, float]]) -> dict[str, float]:
    """Seconds of communication (``comm``), of it ``hidden`` behind computation and
    ``exposed`` (not), of ``compute``, and ``hidden_fraction`` = hidden / comm (0 without
    communication); each argument a list of (start, end), overlapping or not."""
    c, w = union(comm), union(compute)
    total, hidden = _length(c), _intersection(c, w)
    return {"comm": total, "compute": _length(w), "hidden": hidden, "exposed": total - hidden,
            "hidden_fraction": hidden / total if total > 0 else 0.0}


def exposed_time(comm: Iterable[tuple[float, float]],
                 compute: Iterable[tuple[float, float]]) -> float:
    """Seconds during which communication ran and computation did not (lesson 06, exercise)."""
    return overlap(comm, compute)["exposed"]


def _compute_spans(mine: Sequence[Span]) -> list[Span]:
    # On a GPU the kernels are the work; the host's ATen calls only launch them.
    device = [s for s in mine if s.kind == "compute" and s.category == "kernel"]
    return device or [s for s in mine if s.kind == "compute"]


def overlap_table(all_spans: Iterable[Span]) -> list[dict]:
    """Per rank: step window (first to last event), compute, communication, hidden, exposed
    (seconds) and the hidden fraction, from the spans' kinds (module docstring)."""
    by_rank: dict[int, list[Span]] = {}
    for s in all_spans:
        by_rank.setdefault(s.rank, []).append(s)
    rows = []
    for rank in sorted(by_rank):
        mine = by_rank[rank]
        o = overlap([(s.start, s.end) for s in mine if s.kind == "comm"],
                    [(s.start, s.end) for s in _compute_spans(mine)])
        rows.append({"rank": rank, "window": max(s.end for s in mine) - min(s.start for s in mine),
                     **o, "collectives": sum(s.kind == "comm" for s in mine)})
    return rows


def recorded_overlap_table(events: Iterable[Event],
                           compute: Mapping[int, Sequence[tuple[str, float, float]]]) -> list[dict]:
    """`overlap_table`'s columns from lesson 04's view of a step: per rank, `toolkit.comm`'s
    all-reduce events (start to the end of their wait; one never waited for ends at its start)
    against ``compute[rank]``, (label, start, end) spans of backward from gradient hooks."""
    by_rank: dict[int, list[tuple[float, float]]] = {}
    for e in events:
        if e.op == "all_reduce":
            end = e.end if e.end is not None else e.start
            by_rank.setdefault(e.rank, []).append((e.start, end))
    rows = []
    for rank in sorted(set(by_rank) | set(compute)):
        work = [(s, e) for _, s, e in compute.get(rank, ())]
        comm = by_rank.get(rank, [])
        times = [t for pair in work + comm for t in pair]
        rows.append({"rank": rank, "window": max(times) - min(times) if times else 0.0,
                     **overlap(comm, work), "collectives": len(comm)})
    return rows


def symptoms(all_spans: Iterable[Span], *, rank: int = 0) -> dict[str, float]:
    """What one rank's spans say about the three bottlenecks of lesson 06 (module docstring):
    ``copies`` (copy operators issued from Python, not from inside another operator),
    ``collectives`` (comm spans), ``grad_tensors`` (gradients accumulated: autograd's
    AccumulateGrad, one per parameter tensor), ``median_bytes`` of a collective, and
    ``early_launches`` (launches issued before their thread's last matmul: communication started
    during backward)."""
    mine = [s for s in all_spans if s.rank == rank]
    if not mine:
        raise ValueError(f"symptoms: no spans of rank {rank}")
    comm = [s for s in mine if s.kind == "comm"]
    early = 0
    for thread in {s.thread for s in mine}:
        mms = [s.start for s in mine if s.thread == thread and s.name == "aten::mm"]
        if mms:
            early += sum(s.thread == thread and s.kind == "launch" and s.start < max(mms)
                         for s in mine)
    return {"copies": sum(s.name in COPY_OPS and s.parent is None for s in mine),
            "collectives": len(comm),
            "grad_tensors": sum(s.name == "torch::autograd::AccumulateGrad" for s in mine),
            "median_bytes": statistics.median(s.nbytes for s in comm) if comm else 0.0,
            "early_launches": early}


def diagnose(all_spans: Iterable[Span], *, rank: int = 0, copies: int = 64) -> str:
    """The reference reading of lesson 06's slow steps, one of `DIAGNOSES`, from `symptoms`:
    at least `copies` copies issued from Python → "copy in a loop"; collectives, none launched
    before the last backward matmul → "blocking all-reduce"; as many collectives as gradient
    tensors (each sent alone, nothing bucketed) → "bucket cap too small"; else "no bottleneck
    found"."""
    s = symptoms(all_spans, rank=rank)
    if s["copies"] >= copies:
        return "copy in a loop"
    if s["collectives"] and not s["early_launches"]:
        return "blocking all-reduce"
    if s["grad_tensors"] > 1 and s["collectives"] >= s["grad_tensors"]:
        return "bucket cap too small"
    return "no bottleneck found"
