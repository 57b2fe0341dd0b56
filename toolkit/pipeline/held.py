"""What a stage holds while it runs its schedule: micro-batches between their forward and the op
that frees what the forward saved.

A forward saves activations for its backward. Without W ops the backward frees them; with the
backward split (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, section 2.3 and
Table 1) B frees what only the input gradient needed but W still needs the layers' inputs and
the output gradients B received, so a micro-batch between its B and its W holds a part of its
activations: M_W against M_B in the paper (M_W = 32·s·b·h bytes per transformer layer against
M_B = s·b·(34h + 5a·s), 16-bit, for sequence s, micro-batch b, hidden h, heads a).

Counts are per stage, in (micro-batch, chunk) pairs; multiply by `Schedule.share` for units of
one micro-batch's activations through a whole stage.

    in_flight(zb_h1(4, 8))                         # [4, 4, 4, 4]: F done, W not yet
    peak_held(zb_h1(4, 8), weight_share=0.5)       # [4.0, 3.5, 3.0, 2.5]: stage r holds
                                                   # p − r whole and r half micro-batches
"""

from __future__ import annotations

from .schedules import Schedule


def _trace(schedule: Schedule, stage: int) -> list[tuple[int, int]]:
    """After each op of `stage`: (micro-batches forwarded and not backwarded, backwarded and not
    through W). A whole backward (a B with no W on the stage) frees its micro-batch at once."""
    full = partial = 0
    out = []
    split = schedule.split_on(stage)
    for op in schedule.stages[stage]:
        if op.kind == "F":
            full += 1
        elif op.kind == "B":
            full -= 1
            partial += 1 if (op.mb, op.chunk) in split else 0
        else:
            partial -= 1
        out.append((full, partial))
    return out


def peak_held(schedule: Schedule, *, weight_share: float = 1.0) -> list[float]:
    """Per stage, the most activations held at once, in (micro-batch, chunk) sets: a set counts
    1 between its F and its B and `weight_share` (M_W / M_B) between its B and its W."""
    if not weight_share >= 0:
        raise ValueError(f"peak_held: weight_share (what a micro-batch holds between its B and "
                         f"its W, as a fraction of its whole activations) must be >= 0, got "
                         f"{weight_share!r}")
    return [max((full + weight_share * partial for full, partial in _trace(schedule, r)),
                default=0) for r in range(schedule.p)]


def held_at_peak(schedule: Schedule) -> list[tuple[int, int]]:
    """Per stage, (between F and B, between B and W) at the first moment the stage holds the
    most (micro-batch, chunk) sets in all (the moment `in_flight` counts)."""
    out = []
    for r in range(schedule.p):
        trace = _trace(schedule, r)
        out.append(max(trace, key=lambda fp: fp[0] + fp[1], default=(0, 0)))
    return out


def in_flight(schedule: Schedule) -> list[int]:
    """Per stage, the most (micro-batch, chunk) pairs forwarded but not yet released (by their
    B, or by their W when the schedule has W ops) at once."""
    return [int(x) for x in peak_held(schedule, weight_share=1.0)]


__all__ = ["held_at_peak", "in_flight", "peak_held"]
