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
    lab = small_lab(load_lab(find_lab("01_collectives")), ["ar", "ring4", "bcast"])
    results, heard = {}, {0: [], 1: []}
    ready = threading.Barrier(2)

    def one(i: int) -> None:
        ready.wait()
        results[i] = grade(lab, REFERENCE, limits=LIMITS, workbase=tmp_path,
                           progress=heard[i].append)

    threads = [threading.Thread(target=one, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert sorted(results) == [0, 1]
    for result in results.values():
        assert [c.kind for c in result.checks] == [None] * 3
        for check in result.checks:
            assert_passed(check)
    waited = [i for i in (0, 1) if heard[i] and heard[i][0].startswith("waiting for another")]
    assert len(waited) == 1                      # exactly one of them found the other grading
    other = 1 - waited[0]
    assert not any(line.startswith("waiting") for line in heard[other])
