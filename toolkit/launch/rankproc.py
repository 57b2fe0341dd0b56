"""The parent's handle on one rank process: its pipes, outcome, exit status, and its end."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import psutil

from .outcome import RankOutcome


class RankProcess:
    """The parent's view of one rank: its process, pipes and outcome."""

    def __init__(self, rank: int, pid: int, fds: dict[str, int],
                 popen: subprocess.Popen | None = None):
        self.rank, self.pid, self.fds, self.popen = rank, pid, fds, popen
        self.buf = bytearray()
        self.outcome: RankOutcome | None = None  # None while the rank has not reported
        self.seen_at: float = 0.0                # time.time() the outcome was known
        self.reaped = False
        self._code: int | None = None

    def exit_code(self) -> int | None:
        """The exit code (negative: killed by that signal) if the process ended, else None.

        Linux: read with ``waitid(WNOWAIT)``, which leaves the process unreaped so its pid (and
        process-group id) cannot be reused before the final killpg. Where ``waitid`` does not
        exist (macOS) the process is reaped here and its code kept.
        """
        if self.reaped:
            return self.popen.returncode if self.popen else self._code
        if not hasattr(os, "waitid"):
            if self.popen is not None:
                code = self.popen.poll()
                self.reaped = code is not None
                return code
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == 0:
                return None
            self.reaped, self._code = True, os.waitstatus_to_exitcode(status)
            return self._code
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return None
        if info is None:
            return None
        return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status

    def reap(self) -> None:
        """Wait for the (killed) process so that it leaves no zombie."""
        if self.reaped:
            return
        if self.popen is not None:
            try:
                self.popen.wait(timeout=10)
                self.reaped = True
            except subprocess.TimeoutExpired:
                pass
            return
        end = time.monotonic() + 10  # a process in uninterruptible sleep can take a moment
        while time.monotonic() < end:
            try:
                pid, _ = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.reaped = True
                return
            if pid:
                self.reaped = True
                return
            time.sleep(0.005)

    def close(self, stream: str) -> None:
        """Close the parent's end of one of the rank's pipes ("out", "err" or "res")."""
        fd = self.fds.pop(stream, None)
        if fd is None:
            return
        if self.popen is not None and stream in ("out", "err"):
            (self.popen.stdout if stream == "out" else self.popen.stderr).close()
        else:
            try:
                os.close(fd)
            except OSError:
                pass


def stop_all(ranks: list[RankProcess]) -> None:
    """SIGKILL every rank's process group and every descendant found; reap; close pipes."""
    found: list[psutil.Process] = []
    for r in ranks:
        try:
            found += psutil.Process(r.pid).children(recursive=True)
        except psutil.Error:
            pass
    for r in ranks:
        for kill in (os.killpg, os.kill):
            try:
                kill(r.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    for p in found:
        try:
            p.kill()
        except psutil.Error:
            pass
    for r in ranks:
        r.reap()
    psutil.wait_procs(found, timeout=2)
    for r in ranks:
        for stream in list(r.fds):
            r.close(stream)
