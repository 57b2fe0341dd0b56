"""A grade's budget holds, judging included (issue 30: judging time was added back to the
deadline, and `grade --timeout 60` took 502 s). A judge that would run for ten minutes is
interrupted at the deadline; what was judged before it is scored, the rest says it was not
judged (wall_limit), results.json is valid, nothing of the grade is left. The bound asserted is
loose (the budget plus a minute, against a judge of ten): what a loaded machine adds to the
stop is not what is under test; the margin measured is in docs/grading.md."""

from __future__ import annotations

import dataclasses
import signal
import time

import pytest
from faultkit import ROOT, run_grade

from autograder.judging import NOT_JUDGED, PlannedCase, judge_launch
from autograder.lab import Verdict, load_lab
from autograder.protocol import CaseKey, GroupKey, GroupRecord, RankTraffic
from autograder.report import to_results_json
from autograder.sandbox.limits import Limits

LAB = ROOT / "labs" / "01_collectives"
BUDGET_S = 40.0
SLOW_S = 600.0  # what the slow judge would take


def _slow(r) -> Verdict:
    time.sleep(SLOW_S)
    return Verdict(True)


def _lab(names: list[str], slow: int):
    """Lab 01's first visible checks named by index, one case each; check `slow` judged by a
    judge that sleeps for ten minutes."""
    lab = load_lab(LAB, hidden=False)
    checks = []
    for k, index in enumerate(names):
        check = dataclasses.replace(lab.checks[index], cases=lab.checks[index].cases[:1],
                                    timeout=30.0)
        checks.append(dataclasses.replace(check, judge=_slow) if k == slow else check)
    return dataclasses.replace(lab, checks=checks)


@pytest.mark.multirank
def test_a_judge_past_the_budget_is_cut_and_what_was_judged_is_scored(tmp_path):
    lab = _lab([0, 2, 0], slow=1)
    start = time.monotonic()
    result, data = run_grade(lab, LAB / "collectives.py", tmp_path,
                             limits=Limits(wall_s=BUDGET_S, processes=64))
    took = time.monotonic() - start
    assert took < BUDGET_S + 60 < SLOW_S, took
    first, slow, last = result.checks
    assert first.ok and first.score == first.check.points       # judged before: scored
    assert (slow.score, slow.kind) == (0, NOT_JUDGED) and slow.message.startswith("Not judged")
    assert (last.score, last.kind) == (0, "wall_limit") and "Not run" in last.message
    assert any("budget of 40 s ran out" in n for n in result.notes), result.notes
    assert data["score"] == first.check.points
    assert "Not judged: the grade used up its total budget of 40 s" in str(to_results_json(result))


def test_judging_stops_at_the_deadline_and_restores_a_callers_timer():
    """In-process: the cases judged before the deadline keep their verdicts, the rest are not
    judged; an alarm armed by someone else (pytest-timeout's) is armed again after, with its
    handler."""
    calls = []

    def judge(r) -> Verdict:
        calls.append(1)
        if len(calls) == 2:
            time.sleep(SLOW_S)
        return Verdict(True)

    case = {"world_size": 1, "numel": 2}
    lab = load_lab(LAB, hidden=False)
    check = dataclasses.replace(lab.checks[0], judge=judge, cases=(case, case, case))
    lab = dataclasses.replace(lab, checks=[check], outputs={})
    record = GroupRecord(GroupKey(0, 1), outputs={k: [None] for k in range(3)},
                         traffic={k: [RankTraffic(0)] for k in range(3)})
    cases = {CaseKey(0, k): PlannedCase(case, [None]) for k in range(3)}
    theirs = signal.setitimer(signal.ITIMER_REAL, 0)  # pytest-timeout's, put back below
    handler = signal.signal(signal.SIGALRM, _outer)
    signal.setitimer(signal.ITIMER_REAL, 100.0)
    try:
        judge_launch(lab, record, cases, deadline=time.monotonic() + 2.0, budget=" of 2 s")
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert signal.getsignal(signal.SIGALRM) is _outer and 90 < left <= 100, left
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, handler)
        if theirs[0]:
            signal.setitimer(signal.ITIMER_REAL, *theirs)
    assert [v.passed for v in record.verdicts] == [True, False, False]
    assert all(v.kind == NOT_JUDGED and "of 2 s" in v.message for v in record.verdicts[1:])


def _outer(signum, frame) -> None:
    raise AssertionError("the caller's timer rang during the test")
