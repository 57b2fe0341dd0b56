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
                                   [--save | --record FILE.json]
Timings on a shared machine: run it with ``nice -n -20`` and read the spread. ``--save``
records each lab's times and the class's figures in benchmarks/results/grading.json (`saved`),
where docs/figures.md and docs/grading.md read them.
"""

from __future__ import annotations

import argparse
import csv
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import saved  # noqa: E402  (benchmarks/saved.py)

ROOT = Path(__file__).resolve().parents[1]
LABS = ROOT / "labs"
FAULTS = ROOT / "tests" / "faults" / "01_collectives"
ABOUT = ("`autograder grade` of each lab's reference solution end to end, seconds (median, "
         "min, max of the repeats); a class of mixed lab-01 submissions graded with batch: "
         "its size and mix, seconds, submissions per minute, grade times, the slowest grades, "
         "whether summary.csv holds every submission and exactly the correct ones scored 100. "
         "benchmarks/grading.py --save.")


def group(kind: str) -> str:
    """A class submission's kind as correct, partial (a recognised mistake, the stub) or fault."""
    if kind == "correct":
        return "correct"
    return "partial" if kind == "stub" or kind.startswith("mistake_") else "fault"


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


def class_figures(rows: list[dict], made: dict[str, str], seconds: float, jobs: int) -> dict:
    """What a class's batch shows: `rows` from its summary.csv, `made` (submission → kind),
    the batch's wall `seconds`."""
    times = sorted(float(r["seconds"]) for r in rows)
    correct = sorted(float(r["seconds"]) for r in rows if made.get(r["submission"]) == "correct")
    full = {r["submission"] for r in rows if float(r["score"]) == 100.0}
    slowest = sorted(rows, key=lambda r: -float(r["seconds"]))[:3]
    mix = {g: sum(group(k) == g for k in made.values()) for g in ("correct", "partial", "fault")}
    return {"submissions": len(made), "jobs": jobs, "mix": mix, "seconds": round(seconds, 1),
            "per_minute": round(60 * len(made) / seconds, 2),
            "median_s": round(statistics.median(times), 1),
            "correct_median_s": round(statistics.median(correct), 1) if correct else None,
            # nearest rank: the smallest time at or above 90 % of the correct grades
            "correct_p90_s": round(correct[math.ceil(0.9 * len(correct)) - 1], 1)
            if correct else None,
            "slowest": [[made.get(r["submission"], r["submission"]), float(r["seconds"])]
                        for r in slowest],
            "rows": len(rows), "every_submission": {r["submission"] for r in rows} == set(made),
            "full_marks": len(full),
            "full_marks_are_the_correct": full == {n for n, k in made.items() if k == "correct"}}


def grade_class(n: int, jobs: int, work: Path) -> dict:
    made = make_class(n, work)
    seconds = _run([sys.executable, "-m", "autograder", "batch", str(work / "subs"), "--lab",
                    "01_collectives", "--jobs", str(jobs), "--out", str(work / "out")], show=True)
    with open(work / "out" / "summary.csv") as f:
        figures = class_figures(list(csv.DictReader(f)), made, seconds, jobs)
    kind, slowest = figures["slowest"][0]
    print(f"a class of {n} lab-01 submissions ({figures['mix']['correct']} correct, the rest the "
          f"corpus's faults and mistakes and stubs), batch --jobs {jobs}: {seconds:.0f} s, "
          f"{figures['per_minute']:.1f} submissions per minute; slowest grade {slowest:.1f} s "
          f"({kind}); summary.csv holds {figures['rows']} rows, every submission: "
          f"{figures['every_submission']}; full marks: {figures['full_marks']}")
    return figures


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--labs", default="01,02,03,04,05", help="comma-separated lab numbers, or ''")
    ap.add_argument("--class", dest="size", type=int, default=0,
                    help="grade a class of this many mixed lab-01 submissions (0: skip)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--keep", type=Path, default=None,
                    help="a new folder to keep the submissions and the batch's out/ in "
                         "(summary.csv, each results.json); default: a temporary one, removed")
    saved.add_arguments(ap, "grading")
    args = ap.parse_args(argv)
    save_to = saved.target(ap, args, "grading")
    if args.repeats < 1 or args.jobs < 1 or args.size < 0:
        ap.error("--repeats and --jobs must be >= 1, --class >= 0")
    if args.keep is not None and args.keep.exists():
        ap.error(f"--keep {args.keep}: the folder exists; give a new one")
    work = args.keep or Path(tempfile.mkdtemp(prefix="bench-grading-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        for number in [n for n in args.labs.split(",") if n]:
            name = next((p.name for p in sorted(LABS.iterdir()) if p.name.startswith(number)),
                        None)
            if name is None:
                ap.error(f"--labs: no lab starts with {number!r} in {LABS}")
            load_before = saved.load_average()
            times = one_lab(name, args.repeats, work)
            print(f"{name}: one correct submission, `autograder grade` end to end: median "
                  f"{statistics.median(times):.1f} s (min {min(times):.1f}, max "
                  f"{max(times):.1f}, {args.repeats} runs)")
            saved.record(save_to, "grading", name, {
                "median_s": round(statistics.median(times), 2), "min_s": round(min(times), 2),
                "max_s": round(max(times), 2), "runs": len(times)}, about=ABOUT,
                load_before=load_before, argv=argv)
        if args.size:
            load_before = saved.load_average()
            figures = grade_class(args.size, args.jobs, work)
            saved.record(save_to, "grading", "class", figures, about=ABOUT,
                         load_before=load_before, argv=argv)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
