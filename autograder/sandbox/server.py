"""The grader's handle on the fork server (`autograder.sandbox.zygote`): start it, ask it to
fork a launch's ranks, hear which of them exited, stop it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from .cgroup import PidsGroup
from .limits import fork_server_preexec

MAX_MESSAGE = 1 << 20


class ServerLost(RuntimeError):
    """The fork server died or stopped answering."""


class SandboxRefused(ServerLost):
    """The fork server cannot build the sandbox on this host (its probe, or a rank's
    namespaces, failed): no rank may run. The words say which layer and what to do."""


class ForkServer:
    """One running fork server (trusted: it runs no student code)."""

    def __init__(self, *, group: PidsGroup | None, deadline: float, log: Path,
                 gpus: str = "") -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # gpus: the grade's GPU set ("" on a CPU grade: none visible). The server must never
        # initialise the CUDA driver (a child forked after that cannot use CUDA, nor run a
        # backward once autograd has started its GPU threads); the ranks do. torch's
        # availability check is answered from CUDA_VISIBLE_DEVICES and NVML, not by cuInit.
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "OMP_NUM_THREADS": "1",
               "CUDA_VISIBLE_DEVICES": gpus, "PYTORCH_NVML_BASED_CUDA_CHECK": "1",
               "PYTHONDONTWRITEBYTECODE": "1", "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1"}
        self.control, self.log = ours, log
        with open(log, "wb") as err:  # the grader's own file: no rank can write or link it
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "autograder.sandbox.zygote", str(theirs.fileno())],
                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                pass_fds=(theirs.fileno(),), preexec_fn=fork_server_preexec(group), cwd="/")
        theirs.close()
        self.exits: dict[int, int] = {}
        message = self._next(deadline)
        if "ready" not in message:
            raise ServerLost(f"the fork server said {message!r}")
        self.pid = self.proc.pid

    def _next(self, deadline: float) -> dict:
        while True:
            self.control.settimeout(max(0.01, min(1.0, deadline - time.monotonic())))
            try:
                data = self.control.recv(MAX_MESSAGE)
            except socket.timeout:
                if time.monotonic() >= deadline or self.proc.poll() is not None:
                    raise ServerLost(self._why()) from None
                continue
            except OSError as err:
                raise ServerLost(str(err)) from None
            if not data:
                raise ServerLost(self._why())
            message = json.loads(data)
            if "exited" in message:
                self.exits[int(message["exited"])] = int(message["code"])
            else:
                return message

    def _why(self) -> str:
        try:
            err = self.log.read_bytes()[-2000:].decode(errors="replace")
        except OSError:
            err = ""
        return f"the fork server stopped (exit {self.proc.poll()}): {err}".strip()

    def fork(self, spec: dict, fds: list[int], deadline: float) -> list[int]:
        """Fork one rank per entry of ``spec["ranks"]``; `fds` are their (channel, stdout,
        stderr) descriptors in order. Returns their pids; raises `SandboxRefused` where the
        sandbox cannot be built."""
        try:
            socket.send_fds(self.control, [json.dumps({"fork": spec}).encode()], fds)
        except OSError as err:
            raise ServerLost(str(err)) from None
        answer = self._next(deadline)
        if "refused" in answer:
            raise SandboxRefused(str(answer["refused"]))
        return [int(p) for p in answer["forked"]]

    def poll(self) -> None:
        """Take the exit reports that arrived (non-blocking) into `exits`."""
        self.control.setblocking(False)
        try:
            while True:
                data = self.control.recv(MAX_MESSAGE)
                if not data:
                    return
                message = json.loads(data)
                if "exited" in message:
                    self.exits[int(message["exited"])] = int(message["code"])
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            pass

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        try:
            self.control.close()
        except OSError:
            pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


__all__ = ["ForkServer", "SandboxRefused", "ServerLost"]
