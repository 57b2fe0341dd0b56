"""Two grades started at once from threads of one process (an instructor's notebook with a
thread pool): before, one grade's launch took the other's fork server for an orphan of its own
and killed it, and that grade's checks were "not run" (0-97 of 100 on lab 01's reference). Now
a process grades one submission at a time: both score full marks, the second says it waited."""

from __future__ import annotations

import threading

import pytest
from faultkit import LIMITS, REFERENCE, assert_passed, small_lab

from autograder.grade import grade
from autograder.lab import find_lab, load_lab

pytestmark = pytest.mark.multirank


def test_grades_in_threads_of_one_process_take_turns_and_both_pass(tmp_path):
    """The second grade is started from inside the first (its first progress line: its fork
    server is up), so the two overlap whatever the scheduler does."""
    lab = small_lab(load_lab(find_lab("01_collectives")), ["ar", "ring4", "bcast"])
    results, heard = {}, {0: [], 1: []}
    second_waits = threading.Event()

    def one(i: int) -> None:
        results[i] = grade(lab, REFERENCE, limits=LIMITS, workbase=tmp_path, progress=hear[i])

    def hear_first(line: str) -> None:
        heard[0].append(line)
        if len(heard[0]) == 1:
            second.start()
            assert second_waits.wait(timeout=120), "the second grade never waited"

    def hear_second(line: str) -> None:
        heard[1].append(line)
        if line.startswith("waiting for another grade"):
            second_waits.set()

    hear = {0: hear_first, 1: hear_second}
    second = threading.Thread(target=one, args=(1,))
    one(0)
    second.join(timeout=600)
    assert sorted(results) == [0, 1]
    for result in results.values():
        assert [c.kind for c in result.checks] == [None] * 3
        for check in result.checks:
            assert_passed(check)
    assert heard[1][0].startswith("waiting for another grade in this process")
    assert not any(line.startswith("waiting") for line in heard[0])
