"""Wall time of the autograder, end to end, as an instructor sees it.

1. One correct submission of each lab through `autograder grade` (a fresh process: interpreter
   start, fork server, every visible and hidden check on 1-4 ranks, results.json): median and
   spread of `--repeats` runs per lab.
2. A class (issue 19, section 7): `--class N` lab-01 submissions, mixed: correct ones, every
   fault of the corpus (tests/faults/01_collectives/, appended to the reference), partial ones
   (the corpus's recognised mistakes, the released stubs), graded with ``batch --jobs J``.
   Prints submissions per minute, the slowest grade, and whether summary.csv holds every one.

Usage: python benchmarks/grading.py [--repeats 3] [--labs 01,02] [--class 200] [--jobs 2]
                                   [--keep DIR]   # keep summary.csv and every results.json
Timings on a shared machine: run it with ``nice -n -20`` and read the spread.
"""

from __future__ import annotations

import argparse
import csv
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LABS = ROOT / "labs"
FAULTS = ROOT / "tests" / "faults" / "01_collectives"


def _run(cmd: list[str], *, show: bool = False) -> float:
    """Seconds `cmd` took; its output kept quiet unless `show` (batch's progress bar)."""
    start = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL,
                   stderr=None if show else subprocess.DEVNULL)
    return time.perf_counter() - start


def one_lab(name: str, repeats: int, work: Path) -> list[float]:
    lab = LABS / name
    student = next(p for p in sorted(lab.glob("*.py"))
                   if p.stem not in ("harness", "checks", "expected"))
    return [_run([sys.executable, "-m", "autograder", "grade", str(student), "--lab", name,
                  "--json", str(work / "r.json")]) for _ in range(repeats)]


def make_class(n: int, work: Path) -> dict[str, str]:
    """`n` submission folders under work/subs; returns name → what it is."""
    reference = (LABS / "01_collectives" / "collectives.py").read_text()
    _run([sys.executable, "-m", "autograder", "release", "--lab", "01_collectives", "--out",
          str(work / "student")])
    stub = (work / "student" / "collectives.py").read_text()
    faults = sorted(p.stem for p in FAULTS.glob("*.py"))
    mistakes = [f for f in faults if f.startswith("mistake_")]
    broken = [f for f in faults if not f.startswith("mistake_")]
    kinds: list[tuple[str, str]] = []
    for i in range(n):  # 45 % correct, 20 % partial, 35 % faults, in a fixed rotation
        slot = i % 20
        if slot < 9:
            kinds.append(("correct", reference))
        elif slot < 13:
            name = (mistakes + ["stub"])[i % (len(mistakes) + 1)]
            kinds.append((name, stub if name == "stub" else
                          reference + "\n\n" + (FAULTS / f"{name}.py").read_text()))
        else:
            name = broken[i % len(broken)]
            kinds.append((name, reference + "\n\n" + (FAULTS / f"{name}.py").read_text()))
    out = {}
    for i, (kind, text) in enumerate(kinds):
        folder = work / "subs" / f"s{i:03d}-{kind}"
        folder.mkdir(parents=True)
        (folder / "collectives.py").write_text(text)
        out[folder.name] = kind
    return out


def grade_class(n: int, jobs: int, work: Path) -> None:
    made = make_class(n, work)
    seconds = _run([sys.executable, "-m", "autograder", "batch", str(work / "subs"), "--lab",
                    "01_collectives", "--jobs", str(jobs), "--out", str(work / "out")], show=True)
    with open(work / "out" / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    names = {r["submission"] for r in rows}
    slowest = max(rows, key=lambda r: float(r["seconds"]))
    full = sum(float(r["score"]) == 100.0 for r in rows)
    correct = sum(kind == "correct" for kind in made.values())
    print(f"a class of {n} lab-01 submissions ({correct} correct, the rest the corpus's faults "
          f"and mistakes and stubs), batch --jobs {jobs}: {seconds:.0f} s, "
          f"{60 * n / seconds:.1f} submissions per minute; slowest grade "
          f"{float(slowest['seconds']):.1f} s ({slowest['submission']}); summary.csv holds "
          f"{len(rows)} rows, every submission: {names == set(made)}; full marks: {full}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--labs", default="01,02,03,04,05", help="comma-separated lab numbers, or ''")
    ap.add_argument("--class", dest="size", type=int, default=0,
                    help="grade a class of this many mixed lab-01 submissions (0: skip)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--keep", type=Path, default=None,
                    help="a new folder to keep the submissions and the batch's out/ in "
                         "(summary.csv, each results.json); default: a temporary one, removed")
    args = ap.parse_args()
    if args.keep is not None and args.keep.exists():
        ap.error(f"--keep {args.keep}: the folder exists; give a new one")
    work = args.keep or Path(tempfile.mkdtemp(prefix="bench-grading-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        for number in [n for n in args.labs.split(",") if n]:
            name = next(p.name for p in sorted(LABS.iterdir()) if p.name.startswith(number))
            times = one_lab(name, args.repeats, work)
            print(f"{name}: one correct submission, `autograder grade` end to end: median "
                  f"{statistics.median(times):.1f} s (min {min(times):.1f}, max "
                  f"{max(times):.1f}, {args.repeats} runs)")
        if args.size:
            grade_class(args.size, args.jobs, work)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
