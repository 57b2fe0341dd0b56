"""Shared fixtures: every test must leave no process behind; `one_thread` for tests of tiny
tensor ops."""

from __future__ import annotations

import time

import psutil
import pytest
import torch


def _children() -> dict[int, str]:
    out = {}
    me = psutil.Process()
    for p in me.children(recursive=True):
        try:
            out[p.pid] = f"{p.status()}: {' '.join(p.cmdline()[:3])}"
        except psutil.ZombieProcess:
            out[p.pid] = "zombie (never reaped)"
        except psutil.Error:
            pass
    return out


def _owned_by_fixture(pid: int, before: set[int]) -> bool:
    """Whether `pid` descends from a process that was already running before the test (a
    module-scoped fixture's browser or JupyterLab, which start helpers of their own at any time
    and end them at the fixture's teardown)."""
    try:
        for parent in psutil.Process(pid).parents():
            if parent.pid in before:
                return True
    except psutil.Error:
        pass
    return False


@pytest.fixture(autouse=True)
def no_leftover_processes():
    """Fail a test that leaves a child (or zombie) of the test process behind."""
    before = set(_children())
    yield
    # Tests that start subprocesses end them; on a busy machine their exit can take a moment to
    # be seen. A child still there after 30 s was left behind (the loop ends as soon as it is gone).
    deadline = time.monotonic() + 30.0
    while True:
        extra = {pid: cmd for pid, cmd in _children().items()
                 if pid not in before and not _owned_by_fixture(pid, before)}
        if not extra or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not extra, f"processes left behind: {extra}"


@pytest.fixture
def one_thread():
    """torch on one intra-op thread for the test (use it with ``pytestmark =
    pytest.mark.usefixtures("one_thread")``): small ops on two threads of a loaded 2-core machine
    ran 40x slower (27 s against 0.6 s), thread hand-offs costing more than the work."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
