"""An independent correct solution of lab 04, written from the student edition: schedules
built by simulating each stage's queue of ready work (not the reference's warm-up / steady /
drain loop), tuples instead of lists, and the bubble counted in slots. ZB-H1 as a budget of
pending weight gradients: stage r lets at most r of them wait (a queue), so a W runs only when
the queue would overflow, and the drain flushes it (not the reference's "W of j after B of
j + r")."""

from __future__ import annotations

from collections import deque


def gpipe(p: int, m: int) -> list[list[str]]:
    forwards = tuple(f"F{i}" for i in range(m))
    backwards = tuple(f"B{i}" for i in range(m))
    return [list(forwards + backwards) for _ in range(p)]


def one_f_one_b(p: int, m: int) -> list[list[str]]:
    out = []
    for stage in range(p):
        warm = min(p - 1 - stage, m)
        pending = deque(range(m))      # micro-batches not yet forwarded
        waiting = deque()              # forwarded, backward not yet run (oldest first)
        ops = []
        for _ in range(warm):
            i = pending.popleft()
            ops.append(f"F{i}")
            waiting.append(i)
        while pending:
            i = pending.popleft()
            ops.append(f"F{i}")
            waiting.append(i)
            ops.append(f"B{waiting.popleft()}")
        ops.extend(f"B{i}" for i in waiting)
        out.append(ops)
    return out


def zb_h1(p: int, m: int) -> list[list[str]]:
    out = []
    for stage, row in enumerate(one_f_one_b(p, m)):
        pending = deque()              # micro-batches through B whose W has not run
        ops = []
        for op in row:
            ops.append(op)
            if op[0] == "B":
                pending.append(int(op[1:]))
                if len(pending) > stage:
                    ops.append(f"W{pending.popleft()}")
        ops.extend(f"W{i}" for i in pending)
        out.append(ops)
    return out


def bubble_fraction(p: int, m: int) -> float:
    slots = m + p - 1          # a step is m + p − 1 slots long on every stage
    busy = m                   # of which a stage works m
    return (slots - busy) / slots
