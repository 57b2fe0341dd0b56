"""From a grade's launch records to scores: every case judged in the grader, by its check.

A case is judged only when its launch finished (`GroupRecord.ok`); otherwise every case of the
launch carries the launch's `Failure`. A finished case first passes the courier's own facts
(a collective the courier refused fails it, kind builtin_collective, whatever its values), then
the form its lab declares for every rank's result (`autograder.outputs.conform`: shapes,
dtypes, lengths and keys, before any arithmetic; what the form does not declare is dropped),
then its check's judge, which must not crash a grade on strange outputs: an exception there is
a failed case with words, never a grader failure. Scores are shared equally among a check's
cases.

The grader judges each launch as soon as it ends (`judge_launch`, called by the session) and
keeps only its verdicts: the outputs and the courier's record of one launch (up to the
courier's caps, `autograder.sandbox.courier`) never wait in memory for the next launch. The
verdicts are those `judge_run` would give the full record after the last launch: the same
function on the same facts, only sooner.

Judging counts against the grade's time. `judge_launch` takes the grade's deadline: a case not
judged by then is not judged (kind wall_limit, "not judged"), and a judge still running at the
deadline is interrupted (SIGALRM, in the main thread, where the grader judges; a timer another
caller had set is restored after), so a grade ends by its budget plus the time to stop its
processes, whatever a judge would have cost (docs/grading.md, "A timeout that holds").
"""

from __future__ import annotations

import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

from .lab import CaseResult, Check, Lab
from .outputs import Form, OutputError, conform
from .protocol import CaseKey, GroupKey, GroupRecord, Verdict
from .sanitize import printable


@dataclass
class CheckResult:
    check: Check
    score: float
    passed: int
    total: int
    kind: str | None = None
    """The failure kind (autograder.failures.KINDS) when the check failed for a named reason."""
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.passed == self.total


@dataclass
class PlannedCase:
    """A case as the grader made it: parameters with the grade's seed, and every rank's inputs."""

    case: dict
    inputs: list[Any]


def _refused(result: CaseResult) -> Verdict | None:
    for traffic in result.traffic:
        for op in traffic.refused if traffic is not None else []:
            return Verdict(False, f"Rank {op.rank} called torch's built-in {op.op}: "
                                  f"{op.refused}.", "builtin_collective")
    return None


def _conformed(result: CaseResult, form: Form | None) -> Verdict | None:
    """A failed verdict when a rank's result lacks its declared form; otherwise None, with
    `result.outputs` replaced by the conformed results (only what the form declares)."""
    if form is None:
        return None
    outputs = []
    for rank, (out, inputs) in enumerate(zip(result.outputs, result.inputs)):
        try:
            outputs.append(conform(out, form(result.case, inputs, rank, result.world_size)))
        except OutputError as err:
            return Verdict(False, f"rank {rank}'s result does not have the form the lab's "
                                  f"harness returns (nothing of it was judged): "
                                  f"{printable(str(err))[:300]}")
    result.outputs = outputs
    return None


def judge_case(check: Check, result: CaseResult, form: Form | None = None) -> Verdict:
    bad = _refused(result) or _conformed(result, form)
    if bad is not None:
        return bad
    try:
        verdict = check.judge(result)
    except Exception as err:  # noqa: BLE001 - a judge must not crash a grade on strange outputs
        return Verdict(False, f"the output could not be checked ({type(err).__name__}: "
                              f"{printable(str(err))[:300]}); does it return the right type and "
                              "shape?")
    if not isinstance(verdict, Verdict):
        return Verdict(False, f"the check's judge returned {type(verdict).__name__}")
    return verdict


NOT_JUDGED = "wall_limit"
"""The kind of a case the grade's budget ran out before judging."""


class OutOfTime(BaseException):
    """The grade's deadline passed while judging (a BaseException: no judge's ``except
    Exception`` may swallow it)."""


@contextmanager
def _until(deadline: float | None) -> Iterator[None]:
    """Raise OutOfTime in this block at `deadline` (time.monotonic()): a real-time timer in the
    main thread (elsewhere, or with no deadline, nothing is armed: callers check between
    cases). A timer someone else had armed (pytest-timeout's) is put back, less the time spent
    here."""
    if deadline is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def ring(signum, frame):
        raise OutOfTime()

    began = time.monotonic()
    old_handler = signal.signal(signal.SIGALRM, ring)
    old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL,
                                               max(deadline - began, 1e-3))
    try:
        yield
    finally:
        while True:  # the timer may ring just as the block ends: disarm it whatever happens
            try:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, old_handler)
                break
            except OutOfTime:
                continue
        if old_delay:
            signal.setitimer(signal.ITIMER_REAL,
                             max(old_delay - (time.monotonic() - began), 1e-3), old_interval)


def _not_judged(budget: str) -> Verdict:
    return Verdict(False, f"Not judged: the grade used up its total budget{budget} before this "
                          "case was judged.", NOT_JUDGED)


def _launch_verdicts(check: Check, ci: int, record: GroupRecord,
                     cases: dict[CaseKey, PlannedCase], form: Form | None,
                     out: list[Verdict] | None = None,
                     deadline: float | None = None) -> list[Verdict]:
    """Every case of `record` judged, appended to `out` as it is (so that what was judged
    before an OutOfTime is kept); cases past `deadline` are not judged."""
    out = [] if out is None else out
    ws = record.key.world_size
    indices = [k for k, c in enumerate(check.cases) if c["world_size"] == ws]
    if record.failure is not None:
        f = record.failure
        message = f"[{ws} ranks] {f.message}"
        if f.kind == "exception" and record.log_tail.strip():
            message += f"\nWhat the ranks printed last:\n{record.log_tail.strip()[-800:]}"
        out += [Verdict(False, message, f.kind)] * len(indices)
        return out
    for k in indices:
        if deadline is not None and time.monotonic() >= deadline:
            raise OutOfTime()
        planned = cases[CaseKey(ci, k)]
        outputs = record.outputs.get(k)
        traffic = record.traffic.get(k)
        if outputs is None or traffic is None or any(t is None for t in traffic):
            out.append(Verdict(False, f"case {k}: the ranks returned no result", "exception"))
            continue
        out.append(judge_case(check, CaseResult(planned.case, ws, planned.inputs, outputs,
                                                traffic), form))
    return out


def score(check: Check, verdicts: list[Verdict]) -> CheckResult:
    passed = sum(1 for v in verdicts if v.passed)
    total = len(check.cases)
    failed = [v for v in verdicts if not v.passed]
    kind, message = None, ""
    if failed:
        named = next((v for v in failed if v.kind not in (None, "wrong_result")), failed[0])
        kind, message = named.kind or "wrong_result", named.message
    points = round(check.points * passed / total, 2) if total else 0.0
    return CheckResult(check, points, passed, total, kind if passed < total else None, message)


def judge_launch(lab: Lab, record: GroupRecord, cases: dict[CaseKey, PlannedCase], *,
                 deadline: float | None = None, budget: str = "") -> None:
    """Judge `record`'s cases now (`record.verdicts`) and drop its outputs and traffic. Cases
    not judged by `deadline` (time.monotonic()) are not judged (`budget` names the grade's
    budget in their message, e.g. " of 60 s")."""
    ci = record.key.check
    check = lab.checks[ci]
    judged: list[Verdict] = []
    try:
        with _until(deadline):
            _launch_verdicts(check, ci, record, cases, lab.outputs.get(check.call), judged,
                             deadline)
    except OutOfTime:
        n = sum(1 for c in check.cases if c["world_size"] == record.key.world_size)
        judged += [_not_judged(budget)] * (n - len(judged))
    record.verdicts = judged
    record.outputs.clear()
    record.traffic.clear()


def judge_run(lab: Lab, records: dict[GroupKey, GroupRecord],
              cases: dict[CaseKey, PlannedCase]) -> list[CheckResult]:
    """Every check's result from its launches' records (judged already, or judged here)."""
    results = []
    for ci, check in enumerate(lab.checks):
        verdicts: list[Verdict] = []
        for ws in sorted({c["world_size"] for c in check.cases}):
            record = records.get(GroupKey(ci, ws))
            if record is None:
                n = sum(1 for c in check.cases if c["world_size"] == ws)
                verdicts += [Verdict(False, "The sandbox stopped before this check ran.",
                                     "skipped")] * n
                continue
            verdicts += (record.verdicts if record.verdicts is not None
                         else _launch_verdicts(check, ci, record, cases,
                                               lab.outputs.get(check.call)))
        results.append(score(check, verdicts))
    return results


__all__ = ["NOT_JUDGED", "CheckResult", "OutOfTime", "PlannedCase", "judge_case", "judge_launch",
           "judge_run", "score"]
