"""Chimera: two pipelines over the same stages, in opposite directions, sharing the ranks.

Li & Hoefler, "Chimera: Efficiently Training Large-Scale Neural Networks with Bidirectional
Pipelines", SC 2021, section 3. Rank r holds stage r of the *down* pipeline (chunk 0) and stage
p − 1 − r of the *up* pipeline (chunk 1): two stages' weights per rank, so every stage exists
twice and the two replicas' gradients are summed after the backward (section 3.1; on real
ranks, rank r and rank p − 1 − r exchange them). A basic unit of p micro-batches is split in
two halves, the first half down, the second half up. Where the down pipeline leaves a rank idle
(its fill and drain), the up pipeline has work for it (Figure 3).

How each rank's order is built here: list scheduling of one unit's ops with forward and
backward of equal length (as the paper draws them): whenever a rank is free it runs, of the
ops whose input has arrived, the one furthest along its micro-batch's path (a backward before a
forward). For p even and m = p this gives what section 3.2 and Table 2 count: p − 2 idle slots
per rank against 1F1B's 2(p − 1), an idle fraction of (p − 2)/(2m + p − 2), and activations
from p/2 + 1 micro-batches (ranks 0 and p − 1) to p (the middle ranks), against 1F1B's p on
stage 0 and 1 on the last. For m > p the units are concatenated (section 3.5), each rank
running unit u's ops before unit u + 1's: activations stay those of one unit, and each unit
idles its own p − 2 slots (the simulator counts it; the fills and drains of consecutive units
would have to overlap to reach (p − 2)/(2m + p − 2)). With a backward longer than the forward,
the slots no longer fit and the bubble grows (`simulate`).

    s = chimera(4, 4)     # rank 0: F0 F1 F2.1 B2.1 F3.1 B3.1 B0 B1 (x.1: the up pipeline)
"""

from __future__ import annotations

from ..cost.bubble import check_sizes
from .schedules import Op, Schedule


def _unit(p: int, mbs: range) -> list[list[Op]]:
    """One basic unit by list scheduling (unit-time ops; see the module docstring)."""
    half = len(mbs) // 2
    down = set(mbs[:half])

    def rank(mb: int, k: int) -> int:          # stage k of mb's pipeline lives on this rank
        return k if mb in down else p - 1 - k

    done: dict[tuple[int, str, int], int] = {}  # (mb, kind, stage) -> end time
    free = [0] * p
    rows: list[list[Op]] = [[] for _ in range(p)]
    pending = {(mb, kind, k) for mb in mbs for kind in "FB" for k in range(p)}
    while pending:
        best = None
        for mb, kind, k in pending:
            if kind == "F":
                dep = (mb, "F", k - 1) if k > 0 else None
            else:
                dep = (mb, "F", k) if k == p - 1 else (mb, "B", k + 1)
            if dep is not None and dep not in done:
                continue
            ready = max(free[rank(mb, k)], done[dep] if dep else 0)
            progress = k if kind == "F" else 2 * p - 1 - k   # steps of its path already behind
            cand = (ready, -progress, mb, kind, k)
            best = cand if best is None or cand < best else best
        ready, _, mb, kind, k = best
        r = rank(mb, k)
        done[mb, kind, k] = free[r] = ready + 1
        pending.remove((mb, kind, k))
        rows[r].append(Op(kind, mb, 0 if mb in down else 1))
    return rows


def chimera(p: int, m: int) -> Schedule:
    """Chimera's bidirectional schedule (Li & Hoefler 2021, section 3) for p stages (even) and
    m micro-batches (even; at most p, or a multiple of p): in each unit of min(m, p)
    micro-batches the first half goes down (chunk 0, stage r on rank r), the second half up
    (chunk 1, stage p − 1 − r on rank r); units run one after the other."""
    check_sizes("chimera", p, m)
    if p % 2 or m % 2:
        raise ValueError(f"chimera: p (stages) and m (micro-batches) must both be even, got "
                         f"p = {p}, m = {m}: the two pipelines share each unit's micro-batches "
                         f"half and half, and only an even p lets their slots interlock "
                         f"(Li & Hoefler 2021, section 3.1)")
    if m > p and m % p:
        raise ValueError(f"chimera: m (micro-batches) = {m} must be at most p = {p} or a "
                         f"multiple of it (units of p micro-batches, section 3.5); try "
                         f"m = {m - m % p} or {m + p - m % p}")
    unit = min(m, p)
    rows: list[list[Op]] = [[] for _ in range(p)]
    for start in range(0, m, unit):
        for r, ops in enumerate(_unit(p, range(start, start + unit))):
            rows[r] += ops
    return Schedule(tuple(map(tuple, rows)), m=m, v=2, name="chimera", layout="bidirectional")


__all__ = ["chimera"]
