"""spawn under failure: every way a rank can go wrong ends in a clear error and no process left.

The autouse fixture in conftest.py fails any test that leaves a child process behind; tests
that start grandchildren check those by pid.

Tests that hang on purpose use HANG_S: long enough that on a loaded laptop every rank has
reached the call the report must name (a rank still starting up would be reported as "had not
made any communication call"). A timeout never fires early, so lower bounds on elapsed time
are asserted; upper bounds are not: how fast a busy machine is decides them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch
import torch.distributed as dist

from toolkit.launch import RankError, SpawnTimeout, spawn

from procs import gone

pytestmark = pytest.mark.multirank

HANG_S = 8  # the timeout of a launch that is meant to hang


def raise_on_two(rank, world_size):
    t = torch.ones(3)
    if rank == 2:
        raise ValueError("boom on rank two")
    dist.all_reduce(t)  # the others wait for rank 2 here
    return rank


def test_exception_names_the_rank_and_stops_the_others_at_once():
    t0 = time.monotonic()
    with pytest.raises(RankError) as info:
        spawn(raise_on_two, 4, timeout=120)
    elapsed = time.monotonic() - t0
    err = info.value
    assert err.rank == 2 and err.world_size == 4
    assert err.kind == "exception" and err.exc_type == "ValueError"
    assert isinstance(err.exception, ValueError) and str(err.exception) == "boom on rank two"
    assert "raise_on_two" in err.traceback
    assert 'raise ValueError("boom on rank two")' in err.traceback
    assert "rank 2 of 4 raised ValueError: boom on rank two" in str(err)
    # Waiting out the peers would take the whole timeout; stopping them takes a moment.
    assert elapsed < 60, f"peers were not stopped at once ({elapsed:.1f} s; timeout was 120 s)"


def skip_collective(rank, world_size):
    t = torch.ones(1)
    if rank == 1:
        time.sleep(600)  # never joins the all_reduce
    dist.all_reduce(t)
    return rank


def test_hang_is_stopped_at_the_timeout_and_names_each_rank_and_op():
    t0 = time.monotonic()
    with pytest.raises(SpawnTimeout) as info:
        spawn(skip_collective, 3, timeout=HANG_S)
    elapsed = time.monotonic() - t0
    err = info.value
    assert elapsed >= HANG_S
    assert sorted(err.stuck) == [0, 1, 2] and err.finished == []
    for r in (0, 2):
        assert err.stuck[r].startswith("in all_reduce (4 bytes, float32)"), err.stuck[r]
        assert "skip_collective" in err.stuck[r]  # the rank's own stack
    assert "had not made any communication call" in err.stuck[1]
    assert "time.sleep(600)" in err.stuck[1] or "line" in err.stuck[1]
    assert "rank 1:" in str(err) and f"timed out after {HANG_S} s" in str(err)


def spin(rank, world_size):
    if rank == 0:
        while True:
            pass
    dist.recv(torch.zeros(250), src=0)


def test_busy_loop_is_reported_with_the_waiting_peers():
    with pytest.raises(SpawnTimeout) as info:
        spawn(spin, 2, timeout=HANG_S)
    stuck = info.value.stuck
    assert "had not made any communication call" in stuck[0] and "spin" in stuck[0]
    assert stuck[1].startswith("in recv from rank 0 (1,000 bytes, float32)")


def finish_or_hang(rank, world_size):
    if rank == 0:
        return "done"
    time.sleep(600)


def test_timeout_lists_ranks_that_had_finished():
    with pytest.raises(SpawnTimeout) as info:
        spawn(finish_or_hang, 2, timeout=HANG_S)
    assert info.value.finished == [0] and list(info.value.stuck) == [1]


def hard_exit(rank, world_size):
    if rank == 1:
        os._exit(3)
    dist.barrier()


def test_os_exit_is_the_reported_cause_not_the_peers_broken_connections():
    with pytest.raises(RankError) as info:
        spawn(hard_exit, 3, timeout=60)
    assert info.value.rank == 1 and info.value.kind == "exit" and info.value.exit_code == 3, (
        info.value.output)


def segfault(rank, world_size):
    if rank == 0:
        os.kill(os.getpid(), signal.SIGSEGV)
    dist.barrier()


def test_segfault_is_reported_with_the_signal_and_the_python_stack():
    with pytest.raises(RankError) as info:
        spawn(segfault, 2, timeout=60, echo=False)
    err = info.value
    assert err.rank == 0 and err.kind == "signal" and err.exit_code == -signal.SIGSEGV
    assert "SIGSEGV" in str(err)
    assert "segfault" in err.output  # faulthandler printed the rank's stack


def generator(rank, world_size):
    return (i for i in range(3))


def test_unpicklable_result_says_what_to_return():
    with pytest.raises(RankError) as info:
        spawn(generator, 2, timeout=60)
    assert info.value.kind == "result"
    assert "cannot be sent back" in str(info.value) and "generator" in str(info.value)


def calls_exit(rank, world_size):
    sys.exit(2)


def test_sys_exit_is_reported_as_such():
    with pytest.raises(RankError) as info:
        spawn(calls_exit, 2, timeout=60)
    assert info.value.exc_type == "SystemExit" and "sys.exit(2)" in str(info.value)


class PickyError(Exception):
    def __init__(self, *, code):  # keyword-only: pickle cannot rebuild it from args
        super().__init__(f"code {code}")


def picky(rank, world_size):
    raise PickyError(code=7)


def test_exception_that_cannot_be_rebuilt_still_reports_its_text():
    with pytest.raises(RankError) as info:
        spawn(picky, 1, timeout=60)
    assert info.value.exc_type == "PickyError" and "code 7" in str(info.value)


def start_grandchild(rank, world_size, pid_file):
    p = subprocess.Popen(["sleep", "600"])
    with open(f"{pid_file}.{rank}", "w") as f:
        f.write(str(p.pid))
    dist.barrier()  # both pid files are written before rank 1 fails
    if rank == 1:
        raise RuntimeError("leaving a sleeping child behind")
    time.sleep(600)


def test_processes_started_by_ranks_are_killed_too(tmp_path):
    with pytest.raises(RankError):
        spawn(start_grandchild, 2, str(tmp_path / "pid"), timeout=60)
    pids = [int((tmp_path / f"pid.{r}").read_text()) for r in range(2)]
    deadline = time.monotonic() + 60  # killed at once; reaping on a busy machine may lag
    while not all(gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(gone(p) for p in pids), pids


def long_sleep(rank, world_size):
    time.sleep(600)


def test_ctrl_c_in_the_caller_stops_every_rank():
    # Ctrl-C as Python delivers it by default: a process started in the background by a
    # non-interactive shell (`make test &`, a CI step) inherits SIGINT ignored, and then no
    # KeyboardInterrupt would come at all. Restored after.
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        timer = threading.Timer(1.0, os.kill, args=(os.getpid(), signal.SIGINT))
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            spawn(long_sleep, 2, timeout=60)
        timer.join()
    finally:
        signal.signal(signal.SIGINT, old)


def test_without_waitid_deaths_and_results_are_still_seen(monkeypatch):
    """macOS has no os.waitid: the launcher falls back to waitpid/poll."""
    monkeypatch.delattr(os, "waitid")
    with pytest.raises(RankError) as info:
        spawn(hard_exit, 2, timeout=60)
    assert info.value.kind == "exit" and info.value.exit_code == 3
    assert spawn(generator_free_rank, 2, timeout=60) == [0, 1]


def generator_free_rank(rank, world_size):
    dist.barrier()
    return rank


def print_forever(rank, world_size):
    while True:
        print("still going " * 8)


def test_a_rank_printing_forever_still_times_out(capsys):
    with pytest.raises(SpawnTimeout) as info:
        spawn(print_forever, 2, timeout=3)
    assert sorted(info.value.stuck) == [0, 1]
    out, _ = capsys.readouterr()
    assert len(out) < 2 * 1.2e6  # echo stays capped at ~1 MB per rank
