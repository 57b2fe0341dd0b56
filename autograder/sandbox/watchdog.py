"""The grader's view of one launch's processes: find them, measure them, end them.

The processes of a launch are its ranks (children of the fork server), whatever they started,
and orphans the grader adopted as child subreaper (a rank that forked and died). With a pids
cgroup per launch they are simply its members, however they detached themselves. `measure`
sums their resident memory and counts their tasks (forked copies count their shared pages
again, so the memory limit is a ceiling on a sum, set with that in mind); `kill` sends SIGKILL
until none is left and reaps the orphans that are the grader's.
"""

from __future__ import annotations

import os
import signal
import time

import psutil

from ..protocol import Failure
from .cgroup import PidsGroup
from .files import MAX_ENTRIES, Usage
from .limits import MB, Limits


def children_of(pid: int) -> set[int]:
    try:
        return {p.pid for p in psutil.Process(pid).children()}
    except psutil.Error:
        return set()


class LaunchProcesses:
    """Every process of one launch, seen from the grader (`me`, the subreaper)."""

    def __init__(self, *, server: int, ranks: list[int], group: PidsGroup | None,
                 theirs: frozenset[int]) -> None:
        self.server, self.ranks, self.group, self.theirs = server, list(ranks), group, theirs

    def _roots(self) -> set[int]:
        orphans = children_of(os.getpid()) - self.theirs - {self.server}
        return set(self.ranks) | orphans

    def processes(self) -> list[psutil.Process]:
        found: dict[int, psutil.Process] = {}
        pids = set(self.group.pids()) if self.group is not None else set()
        for pid in pids | self._roots():
            try:
                top = psutil.Process(pid)
                for p in [top] + top.children(recursive=True):
                    if p.pid != self.server:
                        found[p.pid] = p
            except psutil.Error:
                pass
        return list(found.values())

    def measure(self) -> tuple[int, int, int]:
        """(resident bytes, tasks, processes) of the launch right now."""
        rss = tasks = n = 0
        for p in self.processes():
            try:
                rss += p.memory_info().rss
                tasks += p.num_threads()
                n += 1
            except psutil.Error:
                pass
        return rss, tasks, n

    def signal(self, pids: list[int], sig: int) -> None:
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def kill(self) -> None:
        """SIGKILL every process of the launch until none is left; reap our orphans."""
        for _ in range(250):
            alive = [p for p in self.processes() if _alive(p)]
            self.signal([p.pid for p in alive], signal.SIGKILL)
            reap(self.theirs | {self.server})
            if not alive:
                break
            time.sleep(0.02)
        if self.group is not None:
            self.group.kill_all()
        reap(self.theirs | {self.server})


def over_limits(procs: LaunchProcesses, limits: Limits, *, ranks: int, printed: int,
                usage: Usage | None, refused_forks: bool) -> Failure | None:
    """The limit one launch is over right now, as a `Failure`, or None. Processes before
    memory: each forked copy counts its shared pages again in the summed RSS, so a fork bomb
    also looks like a memory bomb a moment later."""
    rss, tasks, n = procs.measure()
    if tasks > limits.processes or refused_forks:
        return Failure("process_limit", f"started over {limits.processes} processes or threads")
    if rss > limits.total_memory_mb * MB and n > ranks:
        return Failure("process_limit", f"started {n} processes where the check runs "
                                        f"{ranks} ranks (a fork bomb?)")
    if rss > limits.total_memory_mb * MB:
        return Failure("memory_limit", f"the ranks held {rss / MB:,.0f} MiB together; the "
                                       f"limit is {limits.total_memory_mb:,} MiB")
    if printed > limits.output_mb * MB:
        return Failure("output_limit", f"printed {printed / MB:,.1f} MiB; the limit is "
                                       f"{limits.output_mb:g} MiB")
    if usage is not None and (usage.over or usage.bytes > limits.disk_mb * MB):
        return Failure("disk_limit", f"wrote {usage.bytes / MB:,.0f} MiB in {usage.entries:,} "
                                     f"files and folders (depth {usage.depth}); the limits are "
                                     f"{limits.disk_mb:g} MiB and {MAX_ENTRIES:,} files and "
                                     "folders per launch")
    return None


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:  # gone between listing and asking
        return False


def peak_rss_mib() -> float:
    """This process's own peak resident memory in MiB: /proc/self/status's VmHWM, the high-water
    mark of its address space since it exec'd. Not ``ru_maxrss``: Linux keeps that across
    execve, so a process started by a big one (a pytest worker, a benchmark driver; through
    vfork, even the parent's peak) reports the parent's figure. What the grader's memory is
    measured by (tests/test_autograder_memory.py, benchmarks/grader_footprint.py)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    raise RuntimeError("/proc/self/status has no VmHWM line (not Linux?)")


def reap(keep: frozenset[int] | set[int]) -> None:
    """Wait for exited children of the grader other than `keep` (orphans it adopted): never
    ``waitpid(-1)``, which could take a status the caller's own code is waiting for."""
    for pid in children_of(os.getpid()) - set(keep):
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


__all__ = ["LaunchProcesses", "children_of", "over_limits", "peak_rss_mib", "reap"]
