"""Lab 04: pipeline schedules.

A schedule says, for each pipeline stage r (one rank), the order in which it runs the forward
("F3": forward of micro-batch 3) and backward ("B3") passes of the m micro-batches. Write them
as plain lists: ``[["F0", "F1", "B0", "B1"], [...], ...]``, one list per stage. The grader
checks them with the course's validator, simulates their bubble, and runs them on real ranks
(`toolkit.pipeline.run_pipeline`), so a stage that waits for a message nobody sends, or a
backward before its forward, is reported in words.

The zero-bubble part (`zb_h1`) splits each backward in two: "B3" computes the gradient of the
stage's input for micro-batch 3 (the previous stage waits for it), "W3" the gradient of the
stage's weights (nobody waits for it until the optimizer step).

Run `autograder grade .` in this folder to check your work (README.md explains each
check); `playground.ipynb` draws your schedules as Gantt charts.
"""

from __future__ import annotations


def gpipe(p: int, m: int) -> list[list[str]]:
    """GPipe (Huang et al. 2019): every stage runs all m forwards, then all m backwards."""
    ### BEGIN SOLUTION
    forwards = [f"F{i}" for i in range(m)]
    backwards = [f"B{i}" for i in range(m)]
    return [forwards + backwards for _ in range(p)]
    ### END SOLUTION
    ### HINT: the same list for every stage: F0 ... F(m-1), then B0 ... B(m-1).


def one_f_one_b(p: int, m: int) -> list[list[str]]:
    """1F1B (PipeDream-Flush, Narayanan et al. 2021): each stage runs a few warm-up forwards,
    then alternates one forward and one backward, then drains the remaining backwards, so that
    stage r never holds more than p − r micro-batches' activations (GPipe holds all m)."""
    ### BEGIN SOLUTION
    schedule = []
    for stage in range(p):
        ahead = min(p - 1 - stage, m)   # forwards in flight before the first backward
        ops, next_f, next_b = [], 0, 0
        while next_f < ahead:
            ops.append(f"F{next_f}")
            next_f += 1
        while next_f < m:               # steady state: one forward, one backward
            ops += [f"F{next_f}", f"B{next_b}"]
            next_f, next_b = next_f + 1, next_b + 1
        ops += [f"B{b}" for b in range(next_b, m)]
        schedule.append(ops)
    return schedule
    ### END SOLUTION
    ### HINT: stage r first runs min(p - 1 - r, m) forwards; then, while forwards remain, one
    ### HINT: forward and the oldest waiting backward; then the remaining backwards in order.


def zb_h1(p: int, m: int) -> list[list[str]]:
    """ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, section 2.1): 1F1B's
    F and B order on every stage, with each W placed so that the W fill the drain where 1F1B
    idles: stage r runs the W of micro-batch j right after its B of micro-batch j + r (the W
    left over, those with j + r >= m, run last, in order). Stage r then holds at most p − r
    micro-batches between F and B, as 1F1B does, and r more between B and W (p in all, as
    1F1B's stage 0)."""
    ### BEGIN SOLUTION
    schedule = []
    for stage, row in enumerate(one_f_one_b(p, m)):
        ops, owed = [], 0               # owed: the next micro-batch whose W has not run
        for op in row:
            ops.append(op)
            if op.startswith("B") and int(op[1:]) >= stage:
                ops.append(f"W{owed}")  # the W of micro-batch (this B's) − stage
                owed += 1
        ops += [f"W{j}" for j in range(owed, m)]
        schedule.append(ops)
    return schedule
    ### END SOLUTION
    ### HINT: start from your one_f_one_b(p, m); on stage r, after "Bk" with k >= r, insert
    ### HINT: "W(k - r)"; then append the W not yet placed, in micro-batch order.


def bubble_fraction(p: int, m: int) -> float:
    """The fraction of a GPipe or 1F1B step a stage is idle when forward and backward take the
    same time on every stage and communication is free."""
    ### BEGIN SOLUTION
    return (p - 1) / (m + p - 1)
    ### END SOLUTION
    ### HINT: count the time slots of the whole step and the slots a stage is busy.
