"""Grade a folder of submissions: one grader process per submission, `jobs` at a time.

Each submission (a sub-folder, or a single .py file) is graded by its own
``python -m autograder grade SUB --lab LAB --json OUT/NAME/results.json`` process, so one grade
can never disturb another's state (subreaper, signals, memory), and a grader that dies still
leaves the others going; a submission whose grader dies gets a results.json saying so.
Results: ``OUT/NAME/results.json`` and ``OUT/NAME/report.txt`` per submission, and
``OUT/summary.csv`` (one row per submission: score, seconds, failure kinds, each check's score).
A batch into an ``OUT`` that holds an earlier summary merges: rows of submissions graded again
are replaced, the others kept (as their folders are), and the batch says how many it kept.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from queue import Queue

from .devices import grade_env
from .report import validate_results


def find_submissions(folder: Path) -> list[Path]:
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder} {'is not a folder' if folder.exists() else 'does not exist'}"
                         ": give the folder that holds the submissions (one sub-folder or .py "
                         "file each)")
    subs = sorted(p for p in Path(folder).iterdir()
                  if not p.name.startswith(".") and (p.is_dir() or p.suffix == ".py"))
    if not subs:
        raise ValueError(f"{folder} holds no submissions (sub-folders or .py files)")
    return subs


def grade_command(sub: Path, lab_dir: Path, results: Path, device: str,
                  gpus: list[int] | None) -> tuple[list[str], dict[str, str]]:
    """The grader process of one submission: its command and environment (on cuda, the GPU
    set it holds alone while it runs)."""
    cmd = [sys.executable, "-m", "autograder", "grade", str(sub), "--lab", str(lab_dir),
           "--json", str(results), "--no-color", "--device", device]
    return cmd, {**os.environ, **grade_env(device, gpus)}


STOP_GRACE_S = 30.0
"""Seconds a grader that ran past its time gets to clean up after SIGTERM before SIGKILL."""


def _grade_one(sub: Path, lab_dir: Path, out: Path, timeout: float, device: str = "cpu",
               sets: Queue | None = None) -> tuple[Path, dict, float]:
    target = out / sub.stem
    target.mkdir(parents=True, exist_ok=True)
    results = target / "results.json"
    start = time.monotonic()
    gpus = sets.get() if sets is not None else None
    cmd, env = grade_command(sub, lab_dir, results, device, gpus)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
        (target / "report.txt").write_text(stdout + stderr)
    except subprocess.TimeoutExpired:
        # SIGTERM first: the grader unwinds (its ranks stopped, its folder removed, a zero
        # results.json written); SIGKILL only if that cleanup itself hangs.
        proc.terminate()
        try:
            proc.communicate(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        (target / "report.txt").write_text(f"the grader itself ran past {timeout:g} s\n")
    finally:
        if sets is not None:
            sets.put(gpus)  # the next grade may have this set
    try:
        data = json.loads(results.read_text())
        if validate_results(data):
            raise ValueError(validate_results(data))
    except (OSError, ValueError):
        data = {"score": 0.0, "execution_time": round(time.monotonic() - start, 1),
                "output": "The grader failed on this submission; see report.txt.", "tests": []}
        results.write_text(json.dumps(data, indent=2))
    return sub, data, time.monotonic() - start


def _bar(done: int, total: int, width: int = 30) -> str:
    filled = width * done // total
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total}"


def run_batch(folder: Path, lab_dir: Path, out: Path, *, jobs: int = 2,
              timeout: float = 600.0, stream=sys.stderr, device: str = "cpu",
              gpu_sets: list[list[int]] | None = None) -> list[dict]:
    """Grade every submission in `folder`; write results and summary.csv into `out`. On
    cuda, each running grade holds one of `gpu_sets` (disjoint; `autograder.devices.gpu_sets`),
    so at most ``len(gpu_sets)`` grades run at once whatever `jobs` says."""
    if jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {jobs}")
    sets = None
    if device == "cuda":
        if not gpu_sets:
            raise ValueError("a cuda batch needs GPU sets (autograder.devices.gpu_sets)")
        jobs, sets = min(jobs, len(gpu_sets)), Queue()
        for gpus in gpu_sets:
            sets.put(list(gpus))
    subs = find_submissions(folder)
    out.mkdir(parents=True, exist_ok=True)
    rows, tty = [], stream.isatty()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(_grade_one, s, lab_dir, out, timeout, device, sets)
                   for s in subs]
        for done, fut in enumerate(as_completed(futures), 1):
            sub, data, seconds = fut.result()
            kinds = sorted({k for t in data.get("tests", []) for k in t.get("tags", [])})
            row = {"submission": sub.stem, "score": data.get("score", 0.0),
                   "max_score": sum(t.get("max_score", 0) for t in data.get("tests", [])),
                   "seconds": round(seconds, 1), "failures": " ".join(kinds)}
            row.update({t["name"]: t["score"] for t in data.get("tests", [])})
            rows.append(row)
            line = f"{sub.stem}: {row['score']:g}/{row['max_score']:g} ({seconds:.1f} s)"
            stream.write(f"\r{_bar(done, len(subs))} {line}\n" if not tty else
                         f"\r\033[K{line}\n{_bar(done, len(subs))}")
            stream.flush()
    if tty:
        stream.write("\n")
    kept = earlier_rows(out / "summary.csv", {r["submission"] for r in rows})
    if kept:
        stream.write(f"summary.csv: kept {len(kept)} earlier row(s) of {out} for submissions not "
                     "graded this time; rows of submissions graded again are replaced\n")
    write_summary(out / "summary.csv", rows + kept)
    return rows


def earlier_rows(summary: Path, regraded: set[str]) -> list[dict]:
    """The rows of an earlier summary.csv in the same --out whose submissions were not graded
    again: a batch into an existing folder merges (its folders stay, so do their rows)."""
    if not summary.is_file():
        return []
    with open(summary, newline="") as f:
        return [r for r in csv.DictReader(f) if r.get("submission") not in regraded]


def write_summary(path: Path, rows: list[dict]) -> None:
    """summary.csv: one row per submission, sorted; every check's column (a row without one
    leaves it empty). Written to a temporary file and renamed: never half a file."""
    rows = sorted(rows, key=lambda r: r["submission"])
    columns = list(dict.fromkeys(k for r in rows for k in r))
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, path)


__all__ = ["find_submissions", "grade_command", "run_batch"]
