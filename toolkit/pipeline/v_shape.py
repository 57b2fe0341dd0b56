"""ZB-V: two chunks per rank placed in a V, and the backward split into B and W.

Qi, Wan, Huang & Lin, "Zero Bubble Pipeline Parallelism" (arXiv:2401.10241; ZB-V is in the
version after the ICLR 2024 paper, which has ZB-H1 and ZB-H2 only). The model is cut into 2p
chunks; rank r holds chunk r and chunk 2p − 1 − r (the ``"v"`` layout of
`toolkit.pipeline.schedules`), so a micro-batch's forward runs down the ranks and back up, its
backward down and back up again, and rank 0 holds both the first and the last chunk: it computes
the loss and starts the backward itself, without waiting for a message. Every backward is split
(B, the input gradient, now; W, the weight gradients, to fill a gap). The authors' comparison,
assuming t_F = t_B = t_W (the repository README of sail-sg/zero-bubble-pipeline-parallelism):
bubble rate 0 against 1F1B's (p − 1)/m and ZB-H1's (p − 1)/3m, activation memory 1× 1F1B's,
pipeline communication 2× (every micro-batch crosses 2p − 2 links each way instead of p − 1).

How each rank's order is built here (list scheduling, like the authors' own heuristic; the
op order is then plain data): time runs with every chunk op one unit long; whenever a rank is
free it runs a B whose gradient has arrived, else an F whose input has arrived (chunk 1, further
along its micro-batch's path, before chunk 0), else its oldest W still owed, else it waits for
the first input to arrive. A rank forwards a new micro-batch only while it holds at most 2p
chunk sets (1F1B's p micro-batches on stage 0, each two chunks), counting a set past its B as
`weight_share` of one (M_W/M_B in the paper's Table 1: what W still needs). At equal times this
reaches the bound that no schedule beats in one step, for every p and m ≥ p the tests try: a
rank idles only while the first micro-batch reaches it, (p − 1) chunk forwards = (p − 1)·t_F/2
for the last rank. For even p ≤ 6 and m ≥ 2p (and p = 8 with m < 3p) a rank also never waits
from its own first op to its last, a parallelogram, so the next step's fill can overlap this
step's drain when the optimizer step needs no synchronisation (the paper's section 4): the
authors' zero. Odd p, and p = 8 with m ≥ 3p, keep one or two idle op-times inside a rank's
span; with unequal op times the order built at equal ones no longer reaches the bound
(`simulate` shows by how much).

    s = zb_v(4, 8)           # rank 0: F0 F1 … F6 F0.1 B0.1 …  (x.1: chunk 1, the way back up)
"""

from __future__ import annotations

from ..cost.bubble import check_sizes
from .schedules import Op, Schedule


class _Rank:
    """One rank's state while its order is built."""

    def __init__(self, r: int, p: int) -> None:
        self.virtual = (r, 2 * p - 1 - r)         # chunk 0 on the way down, chunk 1 back up
        self.clock = 0.0
        self.next_f, self.next_b = [0, 0], [0, 0]  # next micro-batch per chunk, in order
        self.owed: list[Op] = []                  # B's whose W has not run, oldest first
        self.held = 0.0                           # chunk sets held, a set past B counting less
        self.ops: list[Op] = []


def _options(st: _Rank, m: int, last: int, done: dict, cap: float) -> list[tuple[float, Op]]:
    """(arrival of its input, op) for the rank's next B and F on each chunk that can run once
    their input is there: B's first, chunk 1 before chunk 0."""
    out = []
    for kind in "BF":
        for chunk in (1, 0):
            k = st.virtual[chunk]
            mb = (st.next_b if kind == "B" else st.next_f)[chunk]
            if mb >= m or (kind == "F" and st.held + 1 > cap):
                continue
            if kind == "F":
                dep = ("F", mb, k - 1) if k > 0 else None
            else:
                dep = ("F", mb, k) if k == last else ("B", mb, k + 1)
            if dep is None or dep in done:
                out.append((done[dep] if dep else 0.0, Op(kind, mb, chunk)))
    return out


def zb_v(p: int, m: int, *, weight_share: float = 0.5) -> Schedule:
    """ZB-V for p stages (ranks) and m micro-batches, as data (see the module docstring):
    every rank holds chunks r and 2p − 1 − r and runs F, B and W of every micro-batch on both,
    holding at most 2p chunk sets between F and W (a set past its B counting `weight_share`)."""
    check_sizes("zb_v", p, m)
    if not 0 <= weight_share <= 1:
        raise ValueError(f"zb_v: weight_share (what a chunk set holds between its B and its W, "
                         f"as a share of its whole activations) must be in 0 … 1, got "
                         f"{weight_share!r}")
    ranks, done, cap, last = [_Rank(r, p) for r in range(p)], {}, 2.0 * p, 2 * p - 1
    left = 6 * m * p
    while left:
        best: tuple[float, int, Op] | None = None
        for r, st in enumerate(ranks):
            options = _options(st, m, last, done, cap)
            now = [op for arrival, op in options if arrival <= st.clock]
            if now:
                pick = (st.clock, r, now[0])
            elif st.owed:
                pick = (st.clock, r, Op("W", st.owed[0].mb, st.owed[0].chunk))
            elif options:
                arrival, op = min(options, key=lambda ao: ao[0])
                pick = (arrival, r, op)
            else:
                continue
            best = pick if best is None or pick[:2] < best[:2] else best
        if best is None:          # cannot happen with cap >= 2 (tests), but never loop forever
            raise RuntimeError(f"zb_v({p}, {m}): no rank can run an op")
        start, r, op = best
        st = ranks[r]
        st.clock = start + 1.0
        st.ops.append(op)
        left -= 1
        done[op.kind, op.mb, st.virtual[op.chunk]] = st.clock
        if op.kind == "F":
            st.next_f[op.chunk] += 1
            st.held += 1
        elif op.kind == "B":
            st.next_b[op.chunk] += 1
            st.owed.append(op)
            st.held -= 1 - weight_share
        else:
            st.owed.pop(0)
            st.held -= weight_share
    return Schedule(tuple(tuple(st.ops) for st in ranks), m=m, v=2, name="zb-v", layout="v")


__all__ = ["zb_v"]
