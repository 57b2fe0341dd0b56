"""Who waits for whom in a pipeline schedule, and one order in which the stages can run.

Dependencies (position k on a micro-batch's path, K = `Schedule.depth` positions; k = chunk·p
+ rank in the loop layout, `Schedule.virtual_stage` in the others): F(mb) on k needs the
activation of F(mb) on k−1; B(mb) on k needs the gradient of B(mb) on k+1, and B(mb) on the
last position needs that stage's own F(mb) (the loss); W(mb) needs its own B(mb) on the same
stage (the output gradient B received), and sends nothing. Sends never block (isend); a stage
blocks only when its next op's input has not been sent yet. So a schedule is deadlock-free
exactly when `run_order`'s simulation runs every op; the validator (`toolkit.pipeline.validate`)
names the stuck stages, and the simulator (`toolkit.pipeline.simulate`) times the ops in that
order.
"""

from __future__ import annotations

from .schedules import Op, Schedule


def needs(schedule: Schedule, stage: int, op: Op) -> tuple[int, Op] | None:
    """The (stage, op) whose output `op` on `stage` waits for, or None (the first stage's
    forwards)."""
    if op.kind == "W":
        return stage, Op("B", op.mb, op.chunk)      # the output gradient its B received
    k, last = schedule.virtual_stage(stage, op.chunk), schedule.depth - 1
    if op.kind == "F":
        if k == 0:
            return None
        src, chunk = schedule.place(k - 1, op.chunk)
        return src, Op("F", op.mb, chunk)
    if k == last:
        return stage, Op("F", op.mb, op.chunk)      # the loss: this stage's own forward
    src, chunk = schedule.place(k + 1, op.chunk)
    return src, Op("B", op.mb, chunk)



def run_order(schedule: Schedule) -> tuple[list[tuple[int, int]], dict[int, int]]:
    """Simulate the sends and receives: every stage runs its next op as soon as that op's input
    exists. Returns the (stage, step) pairs in one possible run order, and, for each stage that
    got stuck, the step it is stuck at (empty when every op ran)."""
    s = schedule
    done: set[tuple[int, Op]] = set()
    pos, order = [0] * s.p, []
    progress = True
    while progress:
        progress = False
        for r in range(s.p):
            while pos[r] < len(s.stages[r]):
                op = s.stages[r][pos[r]]
                dep = needs(s, r, op)
                if dep is not None and dep not in done:
                    break
                done.add((r, op))
                order.append((r, pos[r]))
                pos[r] += 1
                progress = True
    stuck = {r: pos[r] for r in range(s.p) if pos[r] < len(s.stages[r])}
    return order, stuck


__all__ = ["needs", "run_order"]
