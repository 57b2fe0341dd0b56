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
    "disk_limit": "wrote more data to files than allowed",
    "wall_limit": "the whole grade ran out of time",
    "sandbox_violation": "touched a file outside its own folder",
    "tampering": "changed torch.distributed or the grader's instruments",
    "forged_results": "wrote a results.json of its own",
    "skipped": "not run",
}

_SIGNALS = {-s.value: s.name for s in signal.Signals}

# What a rank reports when a *peer* went away (toolkit.launch.diagnose.KNOCK_ON, less timeouts).
_PEER_LEFT = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "ECONNRESET",
              "EPIPE")
# gloo aborts the receiving process (SIGABRT, "terminate called after throwing an instance of
# 'gloo::EnforceNotMet'") when a message is longer than the buffer posted for it:
# "op.preamble.length <= op.nbytes. 20 vs 16. Received data size doesn't match expected size."
# A shorter message is accepted silently: the rest of the buffer keeps its old values.
_GLOO_SIZE = re.compile(r"op\.preamble\.length <= op\.nbytes\. (\d+) vs (\d+)"
                        r"|Received data size doesn't match expected size")
_COMM_OPS = (r"i?send|i?recv|i?send\.wait|i?recv\.wait|wait|barrier|all_reduce|broadcast|reduce|"
             r"all_gather|reduce_scatter|gather|scatter|all_to_all|batch_isend_irecv")


def _last_line(text: str) -> str:
    lines = [line for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def _student_frame(traceback: str, module: str, *, source: bool = False) -> str:
    """The last frame inside the student's file, e.g. 'collectives.py line 12 (in exchange)',
    from a Python traceback (``line 12, in f`` + the source line) or a faulthandler dump
    (``line 12 in f``); with `source`, the line's code too."""
    hits = list(re.finditer(rf'File "[^"]*\b{re.escape(module)}\.py", line (\d+),? in (\S+)'
                            r'(?:\n[ \t]+(\S[^\n]*))?', traceback or ""))
    if not hits:
        return ""
    line, fn, code = hits[-1].groups()
    code = code if code and source and not code.startswith("File ") else ""
    return f"{module}.py line {line} (in {fn}" + (f": `{code.strip()}`" if code else "") + ")"


def _mismatch(rank, log: str, at: str = "") -> tuple[str, str] | None:
    hit = _GLOO_SIZE.search(log or "")
    if not hit:
        return None
    sizes = (f" ({hit.group(1)} bytes arrived for a {hit.group(2)}-byte buffer)"
             if hit.group(1) else "")
    return "mismatch", (
        f"Mismatched sizes: a rank received a message longer than the buffer it posted{sizes}, "
        f"and gloo aborted it (rank {rank} is where it was noticed{at}). Every send must match "
        "its receive in size and dtype. (gloo accepts a *shorter* message silently, leaving the "
        "rest of the buffer as it was: that shows up as a wrong result instead.)")


def classify(record: dict, module: str, log: str = "") -> tuple[str, str]:
    """(kind, message) for a group record whose status is not "ok"; `log` is the tail of what
    the group's ranks printed (gloo's abort messages and faulthandler's dumps land there)."""
    status = record.get("status")
    if status == "skipped":
        return "skipped", f"Not run: {record.get('reason', 'an earlier failure')}."
    if status == "timeout":
        return _classify_timeout(record, module)
    if status != "error":
        return "exception", f"The run ended without results (status {status!r})."
    exc, message = record.get("exc_type") or "", record.get("message") or ""
    tb, rank = record.get("traceback") or "", record.get("rank")
    where = _student_frame(tb, module)
    at = f" at {where}" if where else ""
    text = f"{exc}: {message}" if message else exc or _last_line(tb)
    peer_left = any(marker in f"{message}\n{tb}" for marker in _PEER_LEFT)
    if record.get("kind") in ("exit", "signal"):
        code = record.get("exit_code")
        if code == -signal.SIGXFSZ:
            return "output_limit", (f"Rank {rank} was stopped for writing a file larger than "
                                    "the limit (its printed output goes to a file).")
        if code == -signal.SIGKILL:
            return "memory_limit", (f"Rank {rank} was killed (SIGKILL), most often by the "
                                    "out-of-memory killer: does it allocate huge tensors?")
        crashed = _student_frame(log, module)
        crashed_at = f" at {crashed}" if crashed else ""
        if code == -signal.SIGABRT and (found := _mismatch(rank, log, crashed_at)):
            return found
        if code is not None and code < 0:
            return "crash", (f"Rank {rank} died from {_SIGNALS.get(code, f'signal {-code}')} "
                             f"(a segfault or similar){crashed_at} before returning its result.")
        return "crash", (f"Rank {rank} exited (code {code}) without returning: os._exit or "
                         "sys.exit in your code? Return from the function instead.")
    if exc == "SyntaxError" or exc == "IndentationError":
        return "syntax_error", f"{text}{at}."
    if exc == "NotImplementedError":
        return "not_implemented", (f"Not written yet: {where or 'a function'} still raises "
                                   "NotImplementedError.")
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
    if exc == "PermissionError" and re.search(r"results\.json'?$", message):
        return "forged_results", (f"Rank {rank}{at} tried to write a results.json ({text}): "
                                  "the grader writes results.json itself.")
    if exc == "PermissionError" and "[Errno 1]" in message:  # EPERM: not a file's access
        return "sandbox_violation", (f"Rank {rank}{at}: {text}: the sandbox refused it "
                                     "(signals to processes outside the sandbox, and other "
                                     "privileged calls, are not allowed).")
    if exc == "PermissionError":
        return "sandbox_violation", (f"Rank {rank}{at}: {text}. Submissions may read only their "
                                     "own folder and write only in its tmp/ folder ($TMPDIR).")
    if exc == "AttributeError" and "_lab_harness" in tb and not where:
        return "missing_name", f"{text}: define it with exactly this name."
    if re.search(r"size mismatch|[Mm]ismatch|expected .* bytes|message of size", message):
        return "mismatch", (f"Rank {rank}{at}: {text}. The ranks' sends and receives (or "
                            "collectives) did not match in size or type.")
    if peer_left:
        # The launcher names a rank with an error of its own as the cause whenever there is
        # one; a cause that is itself "peer left" means no rank failed: a peer *returned*
        # (or aborted in gloo) while this one still waited for it.
        found = _mismatch(rank, log, at)
        if found:
            return found
        waiting = [rank] + [int(r) for r in re.findall(r"rank (\d+):", "\n".join(
            o for o in record.get("others") or [] if any(m in o for m in _PEER_LEFT)))]
        ranks = ", ".join(str(r) for r in sorted(set(waiting)))
        here = _student_frame(tb, module, source=True)
        left = next(m for m in _PEER_LEFT if m in f"{message}\n{tb}")
        return "deadlock", (
            f"Deadlock: rank{'s' if len(set(waiting)) > 1 else ''} {ranks} still waited for a "
            f"peer that had already returned (rank {rank} was{' at ' + here if here else ''} "
            f"in a send/recv when gloo reported: {left}). Every rank must "
            "make the same sends, receives and collectives in the same order: a rank that skips "
            "one or returns early leaves its peers waiting for ever.")
    return "exception", f"Rank {rank} raised {text}{at}."


def _in_comm(where: str) -> bool:
    return bool(re.match(rf"in ({_COMM_OPS})\b", where.strip()))


def _classify_timeout(record: dict, module: str = "") -> tuple[str, str]:
    stuck = {int(r): w for r, w in (record.get("stuck") or {}).items()}
    limit = record.get("timeout") or 0
    in_comm = {r: w for r, w in stuck.items() if _in_comm(w)}
    busy = {r: w for r, w in stuck.items() if r not in in_comm}

    def place(w: str) -> str:
        return (_student_frame(w, module) if module else "") or _last_line(w)

    waiting = "; ".join(f"rank {r} {w.splitlines()[0].strip()}" for r, w in sorted(in_comm.items()))
    if in_comm and not busy:
        return "deadlock", (f"Deadlock: after {limit:g} s these ranks were still waiting: "
                            f"{waiting}. Every send needs a matching receive posted at the same "
                            "time: post isend and irecv before waiting on either.")
    lines = "; ".join(f"rank {r} at {place(w)}" for r, w in sorted(busy.items()))
    also = (f" The other ranks were waiting for {'it' if len(busy) == 1 else 'them'}: {waiting}."
            if in_comm else "")
    return "timeout", (f"Still running after {limit:g} s outside any communication call: an "
                       f"infinite loop or a sleep? Where "
                       f"{'it was' if len(busy) == 1 else 'they were'}: {lines}.{also}")


__all__ = ["KINDS", "classify"]
