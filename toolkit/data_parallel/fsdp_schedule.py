"""One FSDP step as a schedule on paper: when each unit is gathered, computed, reduce-scattered
and freed, with and without prefetch; and the recorded traffic turned into ring bytes.

Pure functions, no processes. The model is the α-β one of `toolkit.cost` (Thakur et al. 2005):
a ring all-gather or reduce-scatter of n bytes over p ranks takes (p−1)α + (p−1)/p·nβ. Like
`FullyShardedDataParallel` here, a step over U equal units of B bytes (gathered) is

    forward    for i = 0..U−1:   all-gather i → forward i → free i
    backward   for i = U−1..0:   all-gather i → backward i → reduce-scatter i → free i

Communication runs on one stream, computation on another. Without prefetch, every collective
waits for the compute before it and the compute waits for it: nothing overlaps. With prefetch
(Zhao et al., "PyTorch FSDP", VLDB 2023, §3.3.2-3.3.3, backward and forward prefetching) the
next unit's all-gather is issued when the current unit starts computing, so it runs while that
unit computes; the price is one more gathered unit alive (2B instead of B). The reduce-scatter is
blocking, as in `FullyShardedDataParallel`: the next backward waits for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from ..cost import AlphaBeta, bytes_sent_per_rank, predict

KINDS = ("all-gather", "forward", "backward", "reduce-scatter")
_RING = {"all_gather_into_tensor": "all_gather", "all_gather": "all_gather",
         "all_gather_single": "all_gather", "reduce_scatter_single": "reduce_scatter",
         "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter": "reduce_scatter",
         "all_reduce": "all_reduce"}


@dataclass(frozen=True)
class Interval:
    """One piece of work in the schedule."""

    kind: str
    """One of `KINDS`."""
    unit: int
    start: float
    """Seconds from the start of the step."""
    end: float


@dataclass(frozen=True)
class StepSchedule:
    """A simulated FSDP step (`simulate_step`)."""

    intervals: tuple[Interval, ...]
    step_time: float
    """Seconds from the first all-gather to the last reduce-scatter."""
    peak_gathered_bytes: float
    """Most bytes of gathered (unsharded) parameters alive at once."""
    shard_bytes: float
    """Bytes of parameter shards a rank keeps all the time: U·B/p."""
    comm_time: float
    """Seconds of communication (all-gathers and reduce-scatters)."""
    exposed_comm_time: float
    """Seconds in which communication runs and no compute does: what prefetch hides."""

    unit_bytes: float
    """Gathered bytes of one unit."""

    def gathered_bytes(self) -> list[tuple[float, float]]:
        """(time, bytes of gathered parameters alive) at every change: a step function."""
        return _alive_curve(self.intervals, self.unit_bytes)


def simulate_step(*, units: int, world_size: int, unit_bytes: float, forward_s: float,
                  link: AlphaBeta, prefetch: bool, backward_over_forward: float = 2.0,
                  ) -> StepSchedule:
    """Schedule one step of `units` equal units of `unit_bytes` gathered bytes each on
    `world_size` ranks (module docstring). `forward_s`: compute seconds of one unit's forward;
    a backward takes `backward_over_forward` times that (two matmuls per one)."""
    if units < 1 or world_size < 1:
        raise ValueError(f"simulate_step: units and world_size must be >= 1, got {units}, "
                         f"{world_size}")
    if unit_bytes < 0 or forward_s < 0:
        raise ValueError(f"simulate_step: unit_bytes and forward_s must be >= 0, got "
                         f"{unit_bytes}, {forward_s}")
    p = world_size
    t_ag = float(predict("all_gather", "ring", unit_bytes, p, link)) if p > 1 else 0.0
    t_rs = float(predict("reduce_scatter", "ring", unit_bytes, p, link)) if p > 1 else 0.0
    t_f, t_b = forward_s, forward_s * backward_over_forward
    out: list[Interval] = []
    comm_free = compute_free = 0.0

    def comm(kind: str, unit: int, issued: float, took: float) -> float:
        nonlocal comm_free
        start = max(issued, comm_free)
        comm_free = start + took
        out.append(Interval(kind, unit, start, comm_free))
        return comm_free

    # Forward. Without prefetch a gather is issued when the previous unit has finished; with
    # it, unit i+1's gather is issued as soon as unit i starts computing.
    ready = {0: comm("all-gather", 0, 0.0, t_ag)}
    for i in range(units):
        start = max(ready[i], compute_free)
        if prefetch and i + 1 < units:
            ready[i + 1] = comm("all-gather", i + 1, start, t_ag)
        compute_free = start + t_f
        out.append(Interval("forward", i, start, compute_free))
        if not prefetch and i + 1 < units:
            ready[i + 1] = comm("all-gather", i + 1, compute_free, t_ag)
    # Backward, last unit first: it was freed after its forward, so it is gathered again.
    order = list(range(units - 1, -1, -1))
    ready = {order[0]: comm("all-gather", order[0], compute_free, t_ag)}
    for k, i in enumerate(order):
        start = max(ready[i], compute_free)
        nxt = order[k + 1] if k + 1 < len(order) else None
        if prefetch and nxt is not None:
            ready[nxt] = comm("all-gather", nxt, start, t_ag)
        end = start + t_b
        out.append(Interval("backward", i, start, end))
        compute_free = comm("reduce-scatter", i, end, t_rs)  # blocking: compute waits
        if not prefetch and nxt is not None:
            ready[nxt] = comm("all-gather", nxt, compute_free, t_ag)
    intervals = tuple(sorted(out, key=lambda iv: (iv.start, iv.kind)))
    step = max(iv.end for iv in intervals)
    comm_iv = [iv for iv in intervals if iv.kind in ("all-gather", "reduce-scatter")]
    compute_iv = [iv for iv in intervals if iv.kind in ("forward", "backward")]
    comm_time = sum(iv.end - iv.start for iv in comm_iv)
    hidden = sum(_overlap(c, k) for c in comm_iv for k in compute_iv)
    peak_units = _peak_units(intervals)
    return StepSchedule(intervals, step, peak_units * unit_bytes, units * unit_bytes / p,
                        comm_time, comm_time - hidden, unit_bytes)


def _overlap(a: Interval, b: Interval) -> float:
    return max(0.0, min(a.end, b.end) - max(a.start, b.start))


def _lifetimes(intervals: Iterable[Interval]) -> list[tuple[float, float]]:
    """(allocated, freed) of each gathered buffer: from its all-gather's start to the end of
    its forward (the first U gathers) or of its reduce-scatter (the last U)."""
    intervals = list(intervals)
    gathers = sorted((iv for iv in intervals if iv.kind == "all-gather"), key=lambda iv: iv.start)
    half = len(gathers) // 2
    forward_end = {iv.unit: iv.end for iv in intervals if iv.kind == "forward"}
    scatter_end = {iv.unit: iv.end for iv in intervals if iv.kind == "reduce-scatter"}
    return ([(g.start, forward_end[g.unit]) for g in gathers[:half]]
            + [(g.start, scatter_end[g.unit]) for g in gathers[half:]])


def _alive_curve(intervals: Iterable[Interval], unit_bytes: float) -> list[tuple[float, float]]:
    changes = sorted([(a, 1) for a, _ in _lifetimes(intervals)] +
                     [(b, -1) for _, b in _lifetimes(intervals)], key=lambda c: (c[0], c[1]))
    alive, curve = 0, [(0.0, 0.0)]
    for t, d in changes:
        alive += d
        curve.append((t, alive * unit_bytes))
    return curve


def _peak_units(intervals: Iterable[Interval]) -> int:
    curve = _alive_curve(intervals, 1.0)
    return int(max(b for _, b in curve))


def ring_wire_bytes(op: str, nbytes: int, world_size: int) -> float:
    """Bytes one rank sends for a collective recorded by `toolkit.comm` (which counts what a
    rank passes in: its shard for an all-gather, the full tensor for a reduce-scatter or an
    all-reduce), as a ring moves it; 0 for anything else."""
    if op not in _RING or world_size < 2:
        return 0.0
    full = nbytes * world_size if _RING[op] == "all_gather" else nbytes
    return bytes_sent_per_rank(_RING[op], "ring", full, world_size)


__all__ = ["KINDS", "Interval", "StepSchedule", "ring_wire_bytes", "simulate_step"]
