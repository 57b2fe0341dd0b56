"""All the launches of one grade, in order, within its budget; nothing left behind after.

`run_session` starts the fork server (`server.ForkServer`), runs each launch
(`launch.run_launch`) on fresh ranks, and returns every launch's record. A launch that hits a
limit or its timeout ends alone: its check fails with that kind and the check's other world
sizes are skipped (the same code would fail again), while every other check still runs, each
launch on fresh processes and a fresh folder. A fork server that dies is replaced (a fresh
sandbox) for the launches that remain. All of it fits in `Limits.wall_s` (or the caller's
`deadline`), the caller's judging included: launches that would start after it get
``wall_limit``. Whatever happens, every process of the grade is gone when this returns (the
grader is the child subreaper of the sandbox's orphans while it runs, and restores the flag it
found when it returns). Each launch's record is handed to the caller as soon as the launch ends
(`on_record`), so that no launch's outputs wait for the next.
"""

from __future__ import annotations

import ctypes
import os
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..protocol import Failure, GroupKey, GroupRecord
from .cgroup import PidsGroup
from .launch import LIMIT_KINDS, run_launch
from .plan import Job, LaunchPlan
from .limits import Limits, sandbox_uid
from .server import ForkServer, SandboxRefused, ServerLost
from .summary import describe
from .watchdog import children_of, reap

_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37


@dataclass
class RunResult:
    """What a grade's launches left, as the grader sees it."""

    records: dict[GroupKey, GroupRecord] = field(default_factory=dict)
    sandbox: str = "none"
    """How the ranks were confined, in words."""
    missing: list[str] = field(default_factory=list)
    """Protections this host could not give (the report says so)."""
    restarts: int = 0
    seconds: float = 0.0


def _set_subreaper(on: bool) -> bool:
    """Make this process the child subreaper of the sandbox's orphans (on) or stop being one;
    returns whether it was one before. Left on after a grade, every orphaned grandchild of
    anything the caller starts later (a test's SLURM daemons) would become a zombie of the
    caller that nobody reaps."""
    try:
        libc = ctypes.CDLL(None)
        was = ctypes.c_int(0)
        libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(was), 0, 0, 0)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)
        return bool(was.value)
    except (AttributeError, OSError):
        return False


def _raise_open_files() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 8192 if hard == resource.RLIM_INFINITY else min(8192, hard)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def run_session(job: Job, plans: list[LaunchPlan], limits: Limits, workdir: Path, *,
                on_record: Callable[[GroupRecord], None] | None = None,
                deadline: float | None = None) -> RunResult:
    """Run every launch of `plans` (in order) in the sandbox; see the module docstring.
    `on_record` is called with each launch's record as soon as the launch ends (the grader
    judges it there and drops what only judging needed); its time counts against the budget,
    which ends at `deadline` (time.monotonic(); default: `limits.wall_s` from now), so a grade's
    judging cannot stretch it (a judge added back once made `--timeout 60` take 502 s). The
    caller is the child subreaper during the call only (the flag it had is restored)."""
    was_subreaper = _set_subreaper(True)
    try:
        return _run_session(job, plans, limits, workdir, on_record, deadline)
    finally:
        _set_subreaper(was_subreaper)


def _run_session(job: Job, plans: list[LaunchPlan], limits: Limits, workdir: Path,
                 on_record: Callable[[GroupRecord], None] | None,
                 deadline: float | None) -> RunResult:
    _raise_open_files()
    theirs = frozenset(children_of(os.getpid()))
    uid = sandbox_uid()
    start = time.monotonic()
    deadline = start + limits.wall_s if deadline is None else deadline
    result = RunResult()
    grade_group = PidsGroup.create(f"autograder-{os.getpid()}-{time.monotonic_ns()}",
                                   limits.processes + 8)
    server_group = grade_group.child("server") if grade_group else None
    server: ForkServer | None = None
    skip: dict[int, Failure] = {}
    refused: Failure | None = None  # the sandbox cannot be built here: no launch runs
    confined: dict | None = None
    try:
        for number, plan in enumerate(plans):
            key = plan.key
            if refused is not None or key.check in skip:
                record = GroupRecord(key, failure=refused or skip[key.check])
            elif time.monotonic() >= deadline:
                record = GroupRecord(key, failure=Failure(
                    "wall_limit", f"Not run: the grade used up its total budget of "
                                  f"{limits.wall_s:g} s."))
            else:
                try:
                    if server is None or not server.alive():
                        if server is not None:
                            server.stop()
                            result.restarts += 1
                        server = ForkServer(group=server_group, deadline=deadline,
                                            gpus=job.gpus, log=workdir / "fork-server.log")
                    record, seen = run_launch(server, job, plan, limits, workdir=workdir,
                                              number=number, uid=uid, grade_group=grade_group,
                                              theirs=theirs, deadline=deadline)
                    confined = confined or seen or None
                except SandboxRefused as err:
                    refused = Failure("sandbox_unavailable", f"Not run: {err}")
                    record = GroupRecord(key, failure=refused)
                except ServerLost as err:
                    record = GroupRecord(key, failure=Failure(
                        "skipped", f"Not run: the grader's fork server stopped ({err})."))
                    if server is not None:
                        server.stop()
                    server = None
                    result.restarts += 1
                failure = record.failure
                if failure is not None and failure.kind in ("timeout",) + LIMIT_KINDS:
                    skip[key.check] = Failure("skipped", f"Not run: this check's launch at "
                                                         f"{key.world_size} ranks ended with "
                                                         f"{failure.kind}.")
            result.records[key] = record
            if on_record is not None:
                on_record(record)  # judged within the same budget (`judging.judge_launch`)
    finally:
        if server is not None:
            server.stop()
        if grade_group is not None:
            grade_group.kill_all()
        reap(theirs)
    if confined is not None:
        result.sandbox, result.missing = describe(confined, grade_group, uid,
                                                  bool(confined.get("tmpfs")))
    result.seconds = time.monotonic() - start
    return result


__all__ = ["RunResult", "describe", "run_session"]
