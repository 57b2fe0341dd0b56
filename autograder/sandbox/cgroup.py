"""A pids cgroup per grade, where the host lets us make one (root, cgroup v1 or v2).

It caps the number of tasks of the whole submission (``pids.max``: a fork bomb gets EAGAIN even
as root, where RLIMIT_NPROC is ignored) and lists every process in it (``cgroup.procs``), however
it detached itself (setsid, double fork), so the final sweep misses nothing. Containers that
forbid cgroups (most Docker set-ups) simply get None from `PidsGroup.create`, and the sandbox
relies on rlimits, a separate uid and the watchdog instead.

A grade's group holds no process itself: the fork server joins its child ``server`` and each
launch's ranks a child of their own (`child`), so that a launch can be measured and ended
alone, while ``pids.max`` of the grade's group caps them all together (cgroup v2 lets only a
group without processes of its own have children with controllers).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

_ROOTS = (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup"))  # v1 pids hierarchy, v2 unified


class PidsGroup:
    """One cgroup that the sandbox process joins before exec (its descendants follow)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, name: str, max_tasks: int) -> "PidsGroup | None":
        for root in _ROOTS:
            is_v2 = (root / "cgroup.controllers").exists()
            if is_v2 and "pids" not in (root / "cgroup.subtree_control").read_text().split():
                continue
            if not (root / "cgroup.procs").exists() or not os.access(root, os.W_OK):
                continue
            path = root / name
            try:
                path.mkdir()
                (path / "pids.max").write_text(str(max_tasks))
                return cls(path)
            except OSError:
                try:
                    path.rmdir()
                except OSError:
                    pass
        return None

    def child(self, name: str) -> "PidsGroup | None":
        """A group below this one (no limit of its own; this one's applies), or None."""
        try:
            if (self.path / "cgroup.subtree_control").exists():  # v2: hand the controller down
                (self.path / "cgroup.subtree_control").write_text("+pids")
            (self.path / name).mkdir()
            return PidsGroup(self.path / name)
        except OSError:
            return None

    def join(self) -> None:
        """Move the calling process in (from `preexec`, before exec)."""
        (self.path / "cgroup.procs").write_text("0")

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def refusals(self) -> int:
        """How many forks or clones were refused for the pids.max cap so far."""
        try:
            return sum(int(line.split()[1])
                       for line in (self.path / "pids.events").read_text().splitlines())
        except (OSError, ValueError, IndexError):
            return 0

    def kill_all(self, deadline_s: float = 10.0) -> None:
        """SIGKILL everything in the group (and its children) until it is empty, then remove
        it."""
        for sub in [p for p in self.path.iterdir() if p.is_dir()] if self.path.is_dir() else []:
            PidsGroup(sub).kill_all(deadline_s)
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:  # tasks still exiting
                time.sleep(0.02)


__all__ = ["PidsGroup"]
