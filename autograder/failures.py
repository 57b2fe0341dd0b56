"""Name what went wrong in a launch that did not finish, in words a student understands.

Every failure gets one of the `KINDS` (the report and results.json carry it) and a message that
says what happened, where, and what to try. Decided from what the grader itself saw: the
courier's record (who waited on which call, which call it refused), the fork server's exit
statuses, the watchdog's limits. What a rank reports about an exception (type, message,
traceback) is used only to word its own message, and is sanitised before anyone reads it.
"""

from __future__ import annotations

import re
import signal
from typing import Sequence

from .protocol import Op, RankEnd

KINDS = {
    "wrong_result": "ran, but the result or the traffic is not what the check expects",
    "builtin_collective": "used a torch built-in collective this lab does not allow",
    "missing_file": "the submission lacks a file the lab asks for",
    "ambiguous_file": "several files could be the one the lab asks for",
    "syntax_error": "the file does not parse",
    "import_error": "the module could not be imported",
    "forbidden_import": "imported a module the lab forbids",
    "missing_name": "a function or class the lab asks for is missing",
    "not_implemented": "a function is still the stub (raises NotImplementedError)",
    "exception": "a rank raised an exception",
    "crash": "a rank died (os._exit, sys.exit, a segfault or another signal)",
    "deadlock": "ranks waited for each other forever",
    "mismatch": "ranks made mismatched calls (different sizes, types or collectives)",
    "timeout": "a rank kept running past the time limit (an infinite loop or a sleep?)",
    "memory_limit": "used more memory than allowed",
    "process_limit": "started too many processes or threads",
    "output_limit": "printed more output than allowed",
    "disk_limit": "wrote more data (or more files and folders) than allowed",
    "wall_limit": "the grade ran out of its total time budget",
    "call_limit": "made more communication calls and marks in one launch than the grader records",
    "result_limit": "returned more results in one launch than the grader keeps",
    "sandbox_violation": "touched a file, device, socket or process outside its own reach",
    "tampering": "wrote frames the grader's channel does not accept (forged or corrupted)",
    "forged_results": "wrote a results.json of its own",
    "sandbox_unavailable": "the grading machine could not build the sandbox, so nothing ran "
                           "(not the submission's fault: the message says what to change)",
    "skipped": "not run",
}

_SIGNALS = {-s.value: s.name for s in signal.Signals}


def _last_line(text: str) -> str:
    lines = [line for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def student_frame(text: str, module: str, sources: dict[str, str] | None = None) -> str:
    """The last frame inside the student's file, e.g. 'collectives.py line 12 (in exchange:
    `work.wait()`)', from a Python traceback (``line 12, in f``) or a faulthandler dump
    (``line 12 in f``); the code of the line comes from the grader's copy of the file."""
    hits = list(re.finditer(rf'File "[^"]*\b{re.escape(module)}\.py", line (\d+),? in (\S+)',
                            text or ""))
    if not hits:
        return ""
    line, fn = hits[-1].groups()
    return _where(module, int(line), fn, sources)


def _where(module: str, line: int, fn: str, sources: dict[str, str] | None) -> str:
    lines = (sources or {}).get(f"{module}.py", "").splitlines()
    code = lines[line - 1].strip() if 0 < line <= len(lines) else ""
    return f"{module}.py line {line} (in {fn}" + (f": `{code[:120]}`" if code else "") + ")"


def stack_frame(stack: Sequence, module: str, sources: dict[str, str] | None = None) -> str:
    """The student's innermost frame in a stack the backend sent with a wait."""
    for filename, line, fn in reversed(list(stack or [])):
        if str(filename).endswith(f"/{module}.py"):
            return _where(module, int(line), str(fn), sources)
    return ""


def describe_op(op: Op) -> str:
    """E.g. 'recv from rank 1 (16 bytes, float32)' or 'all_reduce (32 bytes, float32)'."""
    if op.op in ("send", "recv"):
        way = "to" if op.op == "send" else "from"
        who = "any rank" if op.peer == -1 else f"rank {op.peer}"
        what = f"{op.op} {way} {who}"
    else:
        what = op.op
    return f"{what} ({op.nbytes:,} bytes" + (f", {op.dtype}" if op.dtype else "") + ")"


_STUB = re.compile(r"raise\s+NotImplementedError\b")


def _raised_by_stub(tb: str, module: str, sources: dict[str, str] | None) -> bool:
    """Whether the innermost frame of `tb` is a ``raise NotImplementedError`` line of the
    student's file (a stub as `autograder release` writes it), read from the grader's copy of
    the file. A NotImplementedError that torch raises (a meta tensor, an op a dtype lacks) has
    its innermost frame in torch, and is an ordinary exception."""
    frames = re.findall(r'File "([^"]*)", line (\d+)', tb or "")
    if not frames:
        return False
    path, line = frames[-1]
    lines = (sources or {}).get(f"{module}.py", "").splitlines()
    return bool(re.search(rf"(^|/){re.escape(module)}\.py$", path)) and \
        0 < int(line) <= len(lines) and bool(_STUB.match(lines[int(line) - 1].strip()))


def classify_end(end: RankEnd, module: str, log: str = "",
                 sources: dict[str, str] | None = None) -> tuple[str, str]:
    """(kind, message) for a rank that reported an exception or exited early; `log` is the tail
    of what the launch printed (faulthandler's dump of a crash lands there)."""
    rank, exc, message, tb = end.rank, end.exc_type, end.message, end.traceback
    if end.how in ("exit", "killed"):
        code = end.exit_code
        crashed = student_frame(log, module, sources)
        crashed_at = f" at {crashed}" if crashed else ""
        if code == -signal.SIGXFSZ:
            return "disk_limit", (f"Rank {rank} was stopped for writing a file larger than the "
                                  "limit.")
        if code == -signal.SIGKILL:
            return "memory_limit", (f"Rank {rank} was killed (SIGKILL), most often by the "
                                    "out-of-memory killer: does it allocate huge tensors?")
        if code is not None and code < 0:
            return "crash", (f"Rank {rank} died from {_SIGNALS.get(code, f'signal {-code}')} "
                             f"(a segfault or similar){crashed_at} before returning its result.")
        return "crash", (f"Rank {rank} exited (code {code}) without returning: os._exit or "
                         "sys.exit in your code? Return from the function instead.")
    where = student_frame(tb, module, sources)
    at = f" at {where}" if where else ""
    text = f"{exc}: {message}" if message else exc or _last_line(tb)
    if exc in ("SyntaxError", "IndentationError"):
        return "syntax_error", f"{text}{at}."
    if exc == "NotImplementedError" and _raised_by_stub(tb, module, sources):
        return "not_implemented", f"Not written yet: {where} still raises NotImplementedError."
    if "may not be used in this lab" in message:
        return "forbidden_import", f"{message}."
    if exc in ("ImportError", "ModuleNotFoundError"):
        return "import_error", f"{text}{at}" + (
            "." if end.phase == "import" and not where else
            ": only torch, numpy and the standard library are there.")
    if exc == "MemoryError" or "can't allocate memory" in message or "bad_alloc" in message:
        return "memory_limit", f"Rank {rank} ran out of memory{at} ({text})."
    if "No space left on device" in message or "[Errno 28]" in message:
        return "disk_limit", f"Rank {rank}{at}: {text}: its folder is full."
    if exc == "BlockingIOError" or "Resource temporarily unavailable" in message:
        return "process_limit", f"Rank {rank} could not start another process{at} ({text})."
    if exc in ("PermissionError", "OSError") and re.search(r"results\.json'?$", message):
        return "forged_results", (f"Rank {rank}{at} tried to write a results.json ({text}): "
                                  "the grader writes results.json itself.")
    if "[Errno 30]" in message:  # EROFS: everything outside $HOME is a read-only mount
        return "sandbox_violation", (f"Rank {rank}{at}: {text}: a rank may write only in its "
                                     "own folder ($TMPDIR); everything else it sees is "
                                     "read-only.")
    if exc == "FileNotFoundError" and re.search(r"'/[^']*'$", message):
        return "sandbox_violation", (f"Rank {rank}{at}: {text}: a rank's world holds only the "
                                     "interpreter and its packages, the lab's code folder and "
                                     "its own folder ($TMPDIR); no other file of the machine "
                                     "exists there.")
    if exc == "ProcessLookupError":
        return "sandbox_violation", (f"Rank {rank}{at}: {text}: a rank sees only its own "
                                     "processes (it is pid 1 of a namespace of its own).")
    if exc == "PermissionError" and "[Errno 1]" in message:  # EPERM: not a file's access
        return "sandbox_violation", (f"Rank {rank}{at}: {text}: the sandbox refused it "
                                     "(signals to processes outside the sandbox, sockets and "
                                     "other privileged calls are not allowed: ranks talk only "
                                     "through torch.distributed).")
    if exc == "PermissionError":
        return "sandbox_violation", (f"Rank {rank}{at}: {text}. Submissions may read only their "
                                     "own files and write only in their own folder ($TMPDIR).")
    if exc == "AttributeError" and "_lab_harness" in tb and not where:
        return "missing_name", f"{text}: define it with exactly this name."
    return "exception", f"Rank {rank} raised {text}{at}."


__all__ = ["KINDS", "classify_end", "describe_op", "stack_frame", "student_frame"]
