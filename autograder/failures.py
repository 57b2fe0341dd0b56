"""Name what went wrong in a run that did not return results, in words a student understands.

Every failure gets one of the `KINDS` (the report and results.json carry it) and a message that
says what happened, where, and what to try. Decided from the supervisor's record (`status`,
exception type, exit code, where stuck ranks were) and the watchdog's limit, never from anything
the submission claims about itself.
"""

from __future__ import annotations

import re
import signal

KINDS = {
    "wrong_result": "ran, but the result or the traffic is not what the check expects",
    "builtin_collective": "used a torch built-in collective where the lab asks for send/recv",
    "missing_file": "the submission lacks a file the lab asks for",
    "syntax_error": "the file does not parse",
    "import_error": "the module could not be imported",
    "forbidden_import": "imported a module the lab forbids",
    "missing_name": "a function or class the lab asks for is missing",
    "not_implemented": "a function is still the stub (raises NotImplementedError)",
    "exception": "a rank raised an exception",
    "crash": "a rank died (os._exit, sys.exit, a segfault or another signal)",
    "deadlock": "ranks waited for each other forever",
    "mismatch": "ranks made mismatched calls (different sizes or types)",
    "timeout": "a rank kept running past the time limit (an infinite loop or a sleep?)",
    "memory_limit": "used more memory than allowed",
    "process_limit": "started too many processes or threads",
    "output_limit": "printed more output than allowed",
    "wall_limit": "the whole grade ran out of time",
    "sandbox_violation": "touched a file outside its own folder",
    "tampering": "changed torch.distributed or the grader's instruments",
    "forged_results": "wrote a results.json of its own",
    "skipped": "not run",
}

_SIGNALS = {-s.value: s.name for s in signal.Signals}


def _last_line(text: str) -> str:
    lines = [l for l in (text or "").strip().splitlines() if l.strip()]
    return lines[-1].strip() if lines else ""


def _student_frame(traceback: str, module: str) -> str:
    """The last traceback line inside the student's file, e.g. 'collectives.py, line 12'."""
    hits = re.findall(rf'File "[^"]*{re.escape(module)}\.py", line (\d+), in (\S+)', traceback)
    return f"{module}.py line {hits[-1][0]} (in {hits[-1][1]})" if hits else ""


def classify(record: dict, module: str) -> tuple[str, str]:
    """(kind, message) for a group record whose status is not "ok"."""
    status = record.get("status")
    if status == "skipped":
        return "skipped", f"Not run: {record.get('reason', 'an earlier failure')}."
    if status == "timeout":
        return _classify_timeout(record)
    if status != "error":
        return "exception", f"The run ended without results (status {status!r})."
    exc, message = record.get("exc_type") or "", record.get("message") or ""
    tb, rank = record.get("traceback") or "", record.get("rank")
    where = _student_frame(tb, module)
    at = f" at {where}" if where else ""
    text = f"{exc}: {message}" if message else exc or _last_line(tb)
    if record.get("kind") in ("exit", "signal"):
        code = record.get("exit_code")
        if code == -signal.SIGXFSZ:
            return "output_limit", (f"Rank {rank} was stopped for writing a file larger than "
                                    "the limit (its printed output goes to a file).")
        if code == -signal.SIGKILL:
            return "memory_limit", (f"Rank {rank} was killed (SIGKILL), most often by the "
                                    "out-of-memory killer: does it allocate huge tensors?")
        if code is not None and code < 0:
            return "crash", (f"Rank {rank} died from {_SIGNALS.get(code, f'signal {-code}')} "
                             "(a segfault or similar) before returning its result.")
        return "crash", (f"Rank {rank} exited (code {code}) without returning: os._exit or "
                         "sys.exit in your code? Return from the function instead.")
    if exc == "SyntaxError" or exc == "IndentationError":
        return "syntax_error", f"{text}{at}."
    if exc == "NotImplementedError":
        return "not_implemented", f"Not written yet: {where or 'a function'} still raises NotImplementedError."
    if "may not be used in this lab" in message:
        return "forbidden_import", f"{message}."
    if exc in ("ImportError", "ModuleNotFoundError") and "load_module" in tb and not where:
        return "import_error", f"{text}."
    if exc in ("ImportError", "ModuleNotFoundError"):
        return "import_error", f"{text}{at}: only torch, numpy and the standard library are there."
    if exc == "MemoryError" or "can't allocate memory" in message or "bad_alloc" in message:
        return "memory_limit", f"Rank {rank} ran out of memory{at} ({text})."
    if exc == "BlockingIOError" or "Resource temporarily unavailable" in message:
        return "process_limit", f"Rank {rank} could not start another process{at} ({text})."
    if exc == "PermissionError":
        return "sandbox_violation", (f"Rank {rank}{at}: {text}. Submissions may only read and "
                                     "write files in their own folder.")
    if exc == "AttributeError" and "_lab_harness" in tb and not where:
        return "missing_name", f"{text}: define it with exactly this name."
    if re.search(r"size mismatch|[Mm]ismatch|expected .* bytes|message of size", message):
        return "mismatch", (f"Rank {rank}{at}: {text}. The ranks' sends and receives (or "
                            "collectives) did not match in size or type.")
    knock_on = "closed by peer" in message or "Connection reset" in message
    extra = " (another rank had failed first)" if knock_on else ""
    return "exception", f"Rank {rank} raised {text}{at}{extra}."


def _classify_timeout(record: dict) -> tuple[str, str]:
    stuck = {int(r): w for r, w in (record.get("stuck") or {}).items()}
    limit = record.get("timeout")
    in_comm = {r: w for r, w in stuck.items()
               if re.search(r"\bin (i?send|i?recv|wait|barrier|all_reduce|broadcast|reduce|"
                            r"all_gather|reduce_scatter|gather|scatter|batch_isend_irecv)", w)}
    if in_comm:
        lines = "; ".join(f"rank {r} {w.splitlines()[0].strip()}" for r, w in sorted(in_comm.items()))
        return "deadlock", (f"Deadlock: after {limit:g} s these ranks were still waiting: "
                            f"{lines}. Every send needs a matching receive posted at the same "
                            "time: post isend and irecv before waiting on either.")
    lines = "; ".join(f"rank {r}: {_last_line(w)}" for r, w in sorted(stuck.items()))
    return "timeout", (f"Still running after {limit:g} s, not in any communication call: "
                       f"an infinite loop or a sleep? Where they were: {lines}")


__all__ = ["KINDS", "classify"]
