"""Turning what the ranks reported into one error a person can act on.

A failure is shown with its *cause*: the first rank that raised an error of its own or died
outside a communication call. Knock-on failures (gloo's "Connection closed by peer", a rank
that crashed inside a collective because its peer vanished) are listed after it. A hang is
shown rank by rank: the call it was in (from the in-flight board) and its Python stack.
"""

from __future__ import annotations

import os
import signal
import time

from ..comm import InflightBoard
from . import worker
from .errors import RankError, SpawnTimeout
from .outcome import RankFailure
from .output import OutputPump
from .rankproc import RankProcess

# Errors a rank reports *because another rank died*: shown only when nothing better is known.
KNOCK_ON = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
            "Timed out waiting", "communicator was aborted", "ECONNRESET", "EPIPE")


def is_cause(r: RankProcess, board: InflightBoard) -> bool:
    """False when the failure looks like a consequence of another rank failing first.

    Knock-on failures: an error that says a peer's connection went away, or a death
    *inside* a communication call (gloo can crash when a peer vanishes mid-collective).
    A rank that died outside any call, or raised an error of its own, is a cause.
    """
    if r.outcome is None or r.outcome.kind == "ok":
        return False
    if r.outcome.kind == "died":
        slot = board.read(r.rank)
        return slot is None or not slot.active
    failure = r.outcome.failure
    text = f"{failure.message}\n{failure.traceback}"
    return not any(marker in text for marker in KNOCK_ON)


def failure_error(ranks: list[RankProcess], world_size: int, board: InflightBoard,
                  pump: OutputPump, *, rebuild: bool = True) -> RankError:
    """The error for a launch in which some rank failed: the cause, with its traceback."""
    reported = [r for r in ranks if r.outcome is not None and r.outcome.kind != "ok"]
    causes = [r for r in reported if is_cause(r, board)] or reported
    cause = min(causes, key=lambda r: (_when(r), r.rank))
    others = [f"rank {r.rank}: {_one_line(r)}" for r in reported if r is not cause]
    kind, failure, code = _describe(cause)
    stopped = [r.rank for r in ranks if r.outcome is None]
    lines = [f"rank {cause.rank} of {world_size} {_one_line(cause)}"]
    if failure.traceback and kind != "result":
        lines += ["", f"Traceback from rank {cause.rank}:", failure.traceback.rstrip()]
    output = pump.tail(cause.rank)
    if kind in ("exit", "signal") and output:
        lines += ["", f"Last output of rank {cause.rank}:", output]
    if others:
        lines += ["", "Also failed (most likely because of the above):"]
        lines += [f"  {o}" for o in others]
    if stopped:
        one = len(stopped) == 1
        lines += ["", f"{'Rank' if one else 'Ranks'} {', '.join(map(str, stopped))} "
                      f"{'was' if one else 'were'} stopped."]
    exception = None
    if failure.exception and rebuild:  # never for untrusted ranks: see safe_pickle
        import cloudpickle
        try:
            exception = cloudpickle.loads(failure.exception)
        except Exception:  # noqa: BLE001 - an exception class that cannot be rebuilt here
            exception = None
    return RankError("\n".join(lines), rank=cause.rank, world_size=world_size, kind=kind,
                     exc_type=failure.exc_type or None, exception=exception,
                     traceback=failure.traceback, exit_code=code, output=output,
                     others=others)


def timeout_error(ranks: list[RankProcess], world_size: int, timeout: float,
                  board: InflightBoard) -> SpawnTimeout:
    """The error for a launch that outlived its timeout: where each running rank was."""
    running = [r for r in ranks if r.outcome is None]
    stacks = _dump_stacks(running, board)
    now = time.time()
    stuck: dict[int, str] = {}
    for r in running:
        slot = board.read(r.rank)
        where = slot.describe(now) if slot else "had not made any communication call"
        stack = stacks.get(r.rank, "")
        stuck[r.rank] = where + (f"\n{stack}" if stack else "")
    finished = [r.rank for r in ranks if r.outcome is not None]
    lines = [f"spawn timed out after {timeout:g} s with rank(s) "
             f"{', '.join(str(r.rank) for r in running)} of {world_size} still running"
             + (f" (rank(s) {', '.join(map(str, finished))} had returned)" if finished else "")
             + "; every rank was stopped."]
    for rank, text in stuck.items():
        first, *rest = text.split("\n")
        lines.append(f"  rank {rank}: {first}")
        lines += [f"    {line}" for line in rest]
    lines.append("A rank that skips a collective its peers make, a recv with no matching send, "
                 "or a cycle of blocking sends (every rank in send, each waiting for its peer "
                 "to post a recv, as in a ring of send-then-recv on gloo) hangs like this. "
                 "If the work is just slow, pass a larger timeout=.")
    return SpawnTimeout("\n".join(lines), timeout=timeout, stuck=stuck, finished=finished)


# The launcher's frames: below them a rank's stack is the launcher's, not the rank's own code
# (every rank's main thread runs below worker.run_rank).
_LAUNCHER = os.path.join("toolkit", "launch") + os.sep


def _dump_stacks(running: list[RankProcess], board: InflightBoard) -> dict[int, str]:
    """Ask each running rank for its Python stack (faulthandler on SIGUSR1) and read it back."""
    workdir = os.path.dirname(board.path)
    paths = {r.rank: worker.stack_path(workdir, r.rank) for r in running}
    for r in running:
        try:
            os.kill(r.pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass
    # faulthandler writes a dump line by line from the signal handler, innermost frame first;
    # a rank preempted mid-dump on a loaded machine finishes it later. A dump is complete enough
    # once it reaches a launcher frame, where `_user_frames` stops reading: the rank's own
    # frames, all above it, are written by then. 2 s for a rank that never gets there.
    end = time.monotonic() + 2.0
    while time.monotonic() < end and not all(_LAUNCHER in _read(p) for p in paths.values()):
        time.sleep(0.02)
    return {rank: _user_frames(_read(p)) for rank, p in paths.items()}


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _user_frames(dump: str) -> str:
    """The frames of the rank's own code in a faulthandler dump, oldest first.

    faulthandler lists the innermost frame first. Frames of torch.distributed and the recorder
    are dropped; the launcher's frame marks the bottom of the rank's work (below it, a forked
    rank still carries a copy of the caller's stack, which did not run here).
    """
    noise = (os.path.join("toolkit", "comm") + os.sep,
             os.path.join("torch", "distributed") + os.sep)
    frames: list[str] = []
    for line in dump.splitlines():
        line = line.strip()
        if line.startswith(("Thread ", "Current thread ", "Stack ")) and frames:
            break  # only the first (signalled) thread: the rank's main thread
        if not line.startswith("File "):
            continue
        if _LAUNCHER in line:
            break
        if not any(s in line for s in noise):
            frames.append(line)
    if not frames:  # stuck before reaching user code: show the innermost frames as they are
        frames = [s.strip() for s in dump.splitlines() if s.strip().startswith("File ")][:5]
    frames = frames[:10][::-1]
    if not frames:
        return ""
    return "Python stack (most recent call last):\n" + "\n".join(f"  {f}" for f in frames)


def _when(r: RankProcess) -> float:
    if r.outcome and r.outcome.kind == "error":
        return r.outcome.failure.time
    return r.seen_at


_NO_FAILURE = RankFailure("", "", "", time=0.0)  # what a rank that died could not report


def _describe(r: RankProcess) -> tuple[str, RankFailure, int | None]:
    """(kind: a `FAILURE_KINDS` entry, "exit" or "signal"; the failure; the exit code)."""
    assert r.outcome is not None
    if r.outcome.kind == "died":
        code = r.outcome.exit_code
        return ("signal" if code is not None and code < 0 else "exit"), _NO_FAILURE, code
    return r.outcome.failure.kind, r.outcome.failure, None


def _one_line(r: RankProcess) -> str:
    kind, info, code = _describe(r)
    if kind == "signal":
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        extra = {"SIGSEGV": " (segmentation fault)", "SIGKILL": " (out of memory, or killed)",
                 "SIGABRT": " (aborted)"}.get(name, "")
        return f"was killed by {name}{extra} before returning"
    if kind == "exit":
        return f"exited with code {code} before returning (os._exit or a crash in C code)"
    message = info.message.splitlines()[0] if info.message else ""
    if kind == "init":
        return f"failed to join the process group: {info.exc_type}: {message}"
    if kind == "result":
        return (f"returned a value that cannot be sent back to the parent ({info.exc_type}: "
                f"{message}). Return plain data: numbers, lists, dicts, tensors, numpy arrays.")
    if info.exc_type == "SystemExit":
        return f"called sys.exit({message}) instead of returning"
    return f"raised {info.exc_type}: {message}"
