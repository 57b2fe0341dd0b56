"""ZB-H1: 1F1B with the backward split into B (input gradient) and W (weight gradient).

Qi, Wan, Huang & Lin, "Zero Bubble Pipeline Parallelism" (ICLR 2024; arXiv:2401.10241). A
backward pass does two different jobs: B computes dL/d(input) of the stage, which the previous
stage waits for, and W computes dL/d(weights), which nobody waits for until the optimizer step
(section 2, Figure 1). 1F1B runs both as one op, so every stage's first backward waits for the
whole backward (B and W) of every later stage. Splitting it lets B run as soon as its gradient
arrives and W fill the gaps later.

**ZB-H1** (section 2.1, Figure 3 top), for p stages and m micro-batches: stage r runs 1F1B's
warm-up, min(p − r − 1, m) forwards, then alternates F and B; after its k-th B (k = 0, 1, …),
once k ≥ r, it runs the oldest W still owed. What is left at the end (r of them on stage r)
runs after the last B: the *delayed* W fill the drain, where 1F1B idles. Every stage then holds
at most p micro-batches between their F and their W (stage r: p − r before B, r between B and
W), and stage 0 as many as in 1F1B.

With every stage taking t_F, t_B, t_W per micro-batch and free messages, the bubble (idle time
per stage) is (p − 1)(t_F + t_B − t_W) against 1F1B's (p − 1)(t_F + t_B + t_W) (section 2.3,
Table 2): a third of 1F1B's when t_F = t_B = t_W. `toolkit.cost.bubble` holds the formula, and
the simulator (`toolkit.pipeline.simulate`) shows where it holds and where it does not
(t_W > t_F, messages that cost time). ZB-H2 (the paper's *zero*-bubble schedule, section 2.2)
needs 2p − 1 micro-batches in flight and an optimizer step without synchronisation (section 4);
it is not built here.

    s = zb_h1(4, 8)          # stage 0: F0 F1 F2 F3 B0 W0 F4 B1 W1 …
    simulate(s, forward=1, backward=1, weight=1).bubble   # 3/27 = (p−1)·1 / (m·3 + (p−1)·1)
"""

from __future__ import annotations

from ..cost.bubble import check_sizes
from .schedules import Op, Schedule


def _stage(p: int, m: int, r: int) -> tuple[Op, ...]:
    """Stage r's ops in ZB-H1 (see `zb_h1`)."""
    warmup = min(p - r - 1, m)
    row = [Op("F", i) for i in range(warmup)]
    owed = 0                                # next micro-batch whose W has not run
    for k in range(m):
        if k < m - warmup:                  # steady state: one forward, one backward
            row.append(Op("F", warmup + k))
        row.append(Op("B", k))              # then the drain: the remaining backwards
        if k >= r:                          # stage r delays its W by r backwards
            row.append(Op("W", owed))
            owed += 1
    return tuple(row + [Op("W", i) for i in range(owed, m)])


def zb_h1(p: int, m: int) -> Schedule:
    """ZB-H1 (Qi et al. 2024, section 2.1) for p stages and m micro-batches, as data.

    Stage r: w = min(p − r − 1, m) warm-up forwards; then for each remaining micro-batch one F
    and one B; after the k-th B (k counted from 0) the next W once k ≥ r; the W still owed at
    the end run last, in micro-batch order.
    """
    check_sizes("zb_h1", p, m)
    return Schedule(tuple(_stage(p, m, r) for r in range(p)), m=m, name="zb-h1")


__all__ = ["zb_h1"]
