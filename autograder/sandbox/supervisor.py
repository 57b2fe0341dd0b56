"""The sandbox's main process: ``python -m autograder.sandbox.supervisor JOB.json``.

Started by the grader (`autograder.runner`) inside the limits, as its own session, in the
submission's working folder. It confines itself with Landlock, then runs each check group on
real ranks (`toolkit.launch.spawn`, its own timeout per group) and appends one record per group
to ``observations.jsonl`` (flushed at once, so a grade killed half-way keeps what finished).
It never imports the student's module itself: only the ranks do.

A record is ``{"group": id, "status": "ok" | "error" | "timeout", ...}`` with the ranks'
observations (`harness.run_group`) or what went wrong: the failing rank, its exception type,
message, traceback and exit code; for a timeout, each stuck rank and where it was.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from pathlib import Path

from . import landlock
from .limits import sandbox_paths


def _jsonable(value):
    if isinstance(value, bytes):
        return {"__b64__": base64.b64encode(value).decode()}
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def _message(exc_type: str | None, traceback: str) -> str:
    """The exception's message: the traceback's last line after "Type: " (exceptions of
    untrusted ranks are never unpickled, only their text is kept)."""
    lines = [line for line in (traceback or "").strip().splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    for prefix in (f"{exc_type}: ", f"{(exc_type or '').split('.')[-1]}: "):
        if exc_type and prefix in last:
            return last.split(prefix, 1)[1]
    return last


def _tail(text: str, limit: int = 4000) -> str:
    return text if len(text) <= limit else "..." + text[-limit:]


def run_group(job: dict, group: dict) -> dict:
    from toolkit.launch import RankError, SpawnTimeout, spawn

    from .harness import run_group as in_rank

    record = {"group": group["id"]}
    try:
        results = spawn(in_rank, group["world_size"], job, group, timeout=group["timeout"],
                        echo=False, trusted=False, backend="gloo")
    except SpawnTimeout as err:
        record.update(status="timeout", timeout=err.timeout, finished=err.finished,
                      stuck={str(r): _tail(w, 3000) for r, w in err.stuck.items()})
    except RankError as err:
        record.update(status="error", rank=err.rank, kind=err.kind, exc_type=err.exc_type,
                      message=_tail(_message(err.exc_type, err.traceback)),
                      traceback=_tail(err.traceback), exit_code=err.exit_code,
                      others=err.others[:8])
    else:
        record.update(status="ok", ranks=results)
    return record


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[0]).read_text())
    workdir = Path(job["workdir"])
    out = workdir / "observations.jsonl"
    confined = "none"
    if job.get("landlock", True) and landlock.abi_version() >= 1:
        read, write, list_only = sandbox_paths(workdir, job.get("sandbox_modules", ()))
        confined = f"landlock v{landlock.restrict(read, write, list_only)}"
    with open(out, "a") as f:
        f.write(json.dumps({"sandbox": confined, "uid": os.getuid()}) + "\n")
        f.flush()
        timed_out: set[str] = set()
        for group in job["groups"]:
            if group["check"] in timed_out:  # the same code would hang again: save the time
                record = {"group": group["id"], "status": "skipped",
                          "reason": "an earlier run of this check timed out"}
            else:
                record = run_group(job, group)
                if record["status"] == "timeout":
                    timed_out.add(group["check"])
            f.write(json.dumps(_jsonable(record)) + "\n")
            f.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
