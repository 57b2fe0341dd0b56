"""Is a schedule runnable? Problems in plain words, for lessons, tests and a lab's grader.

`problems(schedule)` returns a list of `Problem`s (empty when the schedule is fine); each has a
`kind` a grader can count and a `message` a student can read. `check_schedule` raises
`ScheduleError` (a `ValueError`) listing them. The kinds, roughly the usual mistakes in order:

============  ===============================================================================
kind          meaning
============  ===============================================================================
shape         wrong number of stages, or an op with a bad kind, micro-batch or chunk (or, in a
              bidirectional schedule, a micro-batch on both pipelines)
missing       an F or B (or, when the schedule has W ops, a W) of some micro-batch (and chunk)
              never appears on a stage
duplicate     an op appears more than once on a stage
order         a backward comes before its own forward on the same stage, a W before its B, or
              (token slices) a slice's forward before an earlier slice's, its backward before
              a later slice's
mismatch      two neighbouring stages send and receive a link's messages in different
              orders: a transport that matches messages by order (NCCL, or gloo without
              tags) would hand one micro-batch's tensor to another
deadlock      every stage that is not done waits for a message nobody will send (found by
              simulating the sends and receives)
in_flight     more micro-batches forwarded but not yet released (backwarded, or through their
              W) on a stage than allowed (1F1B: at most p on stage 0)
error         (`problems_by_case` only) the schedule function raised, or returned something
              that is not a list of op lists
============  ===============================================================================

`problems_by_case(fn, cases)` runs a student's schedule function ``fn(p, m)`` (or
``fn(p, m, v)``) on several sizes and collects the problems of each, so a lab's grader can name
the mistake ("backward before forward at p = 2, m = 4") instead of timing out on real ranks.

Who waits for whom (`needs`) and the simulation of sends and receives that finds deadlocks
(`run_order`) are in `toolkit.pipeline.dependencies`; what a stage holds while it runs
(`in_flight`, `peak_held`) is in `toolkit.pipeline.held`.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from .dependencies import needs, run_order
from .held import in_flight
from .schedules import OP_KINDS, Op, Schedule, as_schedule

KINDS = ("shape", "missing", "duplicate", "order", "mismatch", "deadlock", "in_flight", "error")
"""Every `Problem.kind`, roughly in the order they are checked."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a schedule."""

    kind: str
    """One of `KINDS`."""
    message: str
    """A sentence for the student."""
    stage: int | None = None
    """The stage it is about, when there is one."""

    def __str__(self) -> str:
        return self.message


class ScheduleError(ValueError):
    """A schedule that cannot run; `.problems` holds the `Problem`s."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("the schedule cannot run:\n" + "\n".join(f"- {p}" for p in problems))


def _expected(s: Schedule) -> list[tuple[int, int]]:
    """The (micro-batch, chunk) pairs whose ops every stage must run: every chunk of every
    micro-batch (loop), or each micro-batch on the chunk of its pipeline (bidirectional)."""
    if s.layout == "bidirectional":
        return [(mb, s.pipe(mb)) for mb in range(s.m)]
    return [(mb, c) for c in range(s.v) for mb in range(s.m)]


def _structure(s: Schedule, p: int | None) -> list[Problem]:
    out: list[Problem] = []
    if s.p == 0 or s.m < 1:
        return [Problem("shape", f"the schedule has {s.p} stages and {s.m} micro-batches; it "
                                 f"needs at least one of each")]
    if p is not None and s.p != p:
        out.append(Problem("shape", f"the schedule has {s.p} stages, expected p = {p} "
                                    f"(one list of ops per stage)"))
    kinds = OP_KINDS if s.split and not s.mixed else ("F", "B")   # mixed: a B alone is whole
    kinds_text = "F, B or W" if s.split else "F or B"
    expected = _expected(s)
    for r, ops in enumerate(s.stages):
        bad = [op for op in ops if op.kind not in OP_KINDS or not 0 <= op.mb < s.m
               or not 0 <= op.chunk < s.v]
        for op in bad:
            out.append(Problem("shape", f"stage {r}: op {op} is not an {kinds_text} of "
                                        f"micro-batch 0 … {s.m - 1}"
                                        + (f", chunk 0 … {s.v - 1}" if s.v > 1 else ""), r))
        if s.layout == "bidirectional":
            for op in ops:
                if op not in bad and op.chunk != s.pipe(op.mb):
                    bad.append(op)
                    out.append(Problem("shape", f"stage {r}: {op} puts micro-batch {op.mb} on "
                                       f"chunk {op.chunk}, but its other ops run it in the "
                                       f"{'up' if s.pipe(op.mb) else 'down'} pipeline (chunk "
                                       f"{s.pipe(op.mb)}): a micro-batch runs in one pipeline",
                                       r))
        counts = Counter(ops)
        for kind in kinds:
            word = {"F": "forward", "B": "backward", "W": "weight gradient (W)"}[kind]
            for c in sorted({c for _, c in expected}):
                missing = [mb for mb, cc in expected if cc == c and counts[Op(kind, mb, c)] == 0]
                if missing:
                    chunk = f" on chunk {c}" if s.v > 1 else ""
                    out.append(Problem("missing", f"stage {r}: no {word} of micro-batch"
                                       f"{'es' if len(missing) > 1 else ''} "
                                       f"{', '.join(map(str, missing))}{chunk}", r))
        for op, n in sorted(counts.items()):
            if n > 1 and op not in bad:
                out.append(Problem("duplicate", f"stage {r}: {op} appears {n} times; each op "
                                                f"must appear exactly once", r))
    return out


_WHY = {
    "B": "a backward needs the activations its own forward saves",
    "W": "the weight gradient needs the output gradient its B received (and the forward's "
         "saved inputs)",
    "F+": "a token slice's forward reads the keys and values the forwards of the earlier "
          "slices stored",
    "B+": "a token slice's backward needs the gradients that the later slices' backwards send "
          "into its keys and values",
}


def _order(s: Schedule) -> list[Problem]:
    out = []
    for r, ops in enumerate(s.stages):
        first: dict[Op, int] = {}
        for i, op in enumerate(ops):
            first.setdefault(op, i)
        for op, i in first.items():
            before = {"B": [Op("F", op.mb, op.chunk)], "W": [Op("B", op.mb, op.chunk)],
                      "F": []}[op.kind]
            why = [_WHY[op.kind]] if op.kind != "F" else []
            if s.sequence and op.kind in ("F", "B"):    # slices in order, backwards reversed
                step = -1 if op.kind == "F" else 1
                if 0 <= op.mb + step < s.m:
                    before.append(Op(op.kind, op.mb + step, op.chunk))
                    why.append(_WHY[op.kind + "+"])
            for need, reason in zip(before, why):
                if first.get(need, -1) > i:
                    out.append(Problem("order", f"stage {r}: {op} (step {i}) comes before "
                                       f"{need} (step {first[need]}): {reason}", r))
    return out


def _mismatch(s: Schedule) -> list[Problem]:
    """Compare, for every link (src → dst, activations or gradients), the order in which src
    sends with the order in which dst receives."""
    # A message is named by its micro-batch and the chunk that sends it.
    sent: dict[tuple, list[Op]] = defaultdict(list)
    received: dict[tuple, list[Op]] = defaultdict(list)
    for r, ops in enumerate(s.stages):
        for op in ops:
            dep = needs(s, r, op)
            if dep is not None and dep[0] != r:
                received[dep[0], r, op.kind].append(dep[1])
        for op in ops:                       # what r sends: the ops whose consumer is elsewhere
            if op.kind == "W":
                continue                     # a weight gradient stays on its stage
            k, last = s.virtual_stage(r, op.chunk), s.depth - 1
            nxt = k + 1 if op.kind == "F" else k - 1
            if 0 <= nxt <= last and s.place(nxt, op.chunk)[0] != r:
                sent[r, s.place(nxt, op.chunk)[0], op.kind].append(op)
    out = []
    for key in sorted(set(sent) | set(received)):
        src, dst, kind = key
        a, b = sent.get(key, []), received.get(key, [])
        if a != b:
            i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            what = "activations" if kind == "F" else "gradients"
            out.append(Problem(
                "mismatch",
                f"stage {src} sends {what} to stage {dst} for micro-batches {_seq(a)} but stage "
                f"{dst} receives them as {_seq(b)} (first difference at message {i})"
                + (" (mb.c: micro-batch mb from the sender's chunk c)" if s.v > 1 else "")
                + f": matched in order, as NCCL does, stage {dst} would compute one "
                f"micro-batch on another's tensor", dst))
    return out


def _seq(ops: Sequence[Op]) -> str:
    """Micro-batch ids, with ".chunk" (of the sending chunk) when it is not 0."""
    return "[" + ", ".join(str(op)[1:] for op in ops) + "]"


def _deadlock(s: Schedule) -> list[Problem]:
    _, stuck = run_order(s)
    if not stuck:
        return []
    lines = []
    for r, i in stuck.items():
        op = s.stages[r][i]
        src, dep = needs(s, r, op)
        what = "activation" if op.kind == "F" else "gradient"
        lines.append(f"stage {r} is stuck at {op} (step {i}), waiting for the {what} of "
                     f"micro-batch {op.mb} from stage {src}, which stage {src} sends once it "
                     f"has run {dep}")
    done = sum(len(ops) for ops in s.stages) - sum(len(s.stages[r]) - i for r, i in stuck.items())
    return [Problem("deadlock", f"deadlock after {done} of {sum(map(len, s.stages))} ops: "
                    + "; ".join(lines), min(stuck))]


def problems(schedule: Schedule | Iterable[Iterable[Op | str | Sequence]], *,
             p: int | None = None, m: int | None = None, v: int | None = None,
             max_in_flight: int | None = None, layout: str | None = None,
             sequence: bool | None = None, mixed: bool | None = None) -> list[Problem]:
    """Everything wrong with `schedule` (see the module docstring); [] when it can run.

    Pass p, m and v (stages, micro-batches, chunks) when grading a student's lists, so missing
    micro-batches or stages are caught; `max_in_flight` bounds, on every stage, the micro-batches
    forwarded but not yet released (their B, or their W when the schedule has W ops; 1F1B: p).
    `layout`, `sequence` and `mixed` describe plain lists (see `toolkit.pipeline.schedules`). Later
    checks run only when the earlier ones pass: a deadlock is only looked for in a schedule whose
    ops are all there and in order.
    """
    s = as_schedule(schedule, m=m, v=v, layout=layout, sequence=sequence, mixed=mixed)
    found = _structure(s, p)
    if not found:
        found = _order(s)
    if not found:
        found = _mismatch(s) + _deadlock(s)
    if max_in_flight is not None:
        for r, peak in enumerate(in_flight(s)):
            if peak > max_in_flight:
                what = "not yet through their W" if s.split else "not yet backwarded"
                found.append(Problem("in_flight", f"stage {r} holds {peak} micro-batches in "
                                     f"flight (forwarded, {what}); at most {max_in_flight} "
                                     f"allowed: start backwards sooner", r))
    return found


def check_schedule(schedule: Schedule | Iterable[Iterable[Op | str | Sequence]], *,
                   p: int | None = None, m: int | None = None, v: int | None = None,
                   max_in_flight: int | None = None, layout: str | None = None,
                   sequence: bool | None = None, mixed: bool | None = None) -> Schedule:
    """The schedule as a `Schedule` if `problems` finds nothing; else raise `ScheduleError`."""
    found = problems(schedule, p=p, m=m, v=v, max_in_flight=max_in_flight, layout=layout,
                     sequence=sequence, mixed=mixed)
    if found:
        raise ScheduleError(found)
    return as_schedule(schedule, m=m, v=v, layout=layout, sequence=sequence, mixed=mixed)


def problems_by_case(schedule_fn: Callable[..., object], cases: Iterable[Sequence[int]], *,
                     max_in_flight: Callable[[int, int], int] | None = None
                     ) -> dict[tuple[int, ...], list[Problem]]:
    """For each case (p, m) or (p, m, v): the problems of ``schedule_fn(*case)``'s schedule,
    checked against that p, m, v; a function that raises gets one ``"error"`` problem.

    `max_in_flight(p, m)` gives the in-flight limit per case (for 1F1B: ``lambda p, m: p``).
    Cases with no problem map to [].
    """
    out: dict[tuple[int, ...], list[Problem]] = {}
    for case in cases:
        case = tuple(case)
        p, m = case[0], case[1]
        v = case[2] if len(case) > 2 else 1
        call = f"{getattr(schedule_fn, '__name__', 'schedule')}{case}"
        try:
            stages = schedule_fn(*case)
            found = problems(stages, p=p, m=m, v=v,
                             max_in_flight=max_in_flight(p, m) if max_in_flight else None)
        except Exception as err:  # a student's bug, reported, never raised at the grader
            found = [Problem("error", f"raised {type(err).__name__}: {err}")]
        out[case] = [Problem(x.kind, f"{call}: {x.message}", x.stage) for x in found]
    return out


__all__ = ["KINDS", "Problem", "ScheduleError", "check_schedule", "needs", "problems",
           "problems_by_case", "run_order"]
