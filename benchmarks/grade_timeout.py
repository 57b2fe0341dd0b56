"""How far past its budget a grade ends (`autograder grade --timeout T`), judging included.

Each provocation is graded by the command line in a fresh process, timed from its start to its
exit (results.json written, every process of the grade gone):

1. ``launch``: lab 01's visible checks with tests/faults/01_collectives/sleep_forever.py, whose
   every check sleeps: the budget stops the running launch and the rest are not run;
2. ``judge``: a copy of lab 01 whose first visible check's judge sleeps for ten minutes: the
   budget interrupts the judge, the rest is not judged or not run;
3. ``flood``: lab 02's visible checks with tests/faults/02_ddp/traffic_flood.py (20,000
   all-reduces in one backward), where a judge quadratic in them once made `--timeout 60` take
   502 s; judged in linear time it ends well inside the budget.

Prints, per run: T, the seconds the grade took, what it took past T (negative: inside), its
score, and whether results.json is valid Gradescope output.

Usage: python benchmarks/grade_timeout.py [--timeout 30] [--runs 3] [--only launch,judge,flood]
Wall time on a shared machine: the overshoot is what the grader adds after the deadline (the
launch's kill and drain, the fork server's stop, the folders' removal); load adds to it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LABS = ROOT / "labs"

SLOW_JUDGE = """

# ---- benchmarks/grade_timeout.py: the first visible check's judge sleeps for ten minutes ----
import dataclasses as _dataclasses
import time as _time


def _sleeping_judge(r):
    _time.sleep(600)
    return Verdict(True)


CHECKS[0] = _dataclasses.replace(CHECKS[0], judge=_sleeping_judge)
"""


def _with_fault(lab: str, student: str, fault: str, folder: Path) -> Path:
    path = folder / fault / student
    path.parent.mkdir(parents=True)
    path.write_text((LABS / lab / student).read_text() + f"\n\n# ---- fault: {fault} ----\n\n"
                    + (ROOT / "tests" / "faults" / lab / f"{fault}.py").read_text())
    return path


def provocations(folder: Path) -> dict[str, tuple[Path, str, list[str]]]:
    """name → (submission, lab slug or folder, extra options)."""
    slow = folder / "lab" / "01_collectives"
    shutil.copytree(LABS / "01_collectives", slow)
    (slow / "checks.py").write_text((slow / "checks.py").read_text() + SLOW_JUDGE)
    return {
        "launch": (_with_fault("01_collectives", "collectives.py", "sleep_forever", folder),
                   "01_collectives", ["--no-hidden"]),
        "judge": (LABS / "01_collectives" / "collectives.py", str(slow), ["--no-hidden"]),
        "flood": (_with_fault("02_ddp", "ddp.py", "traffic_flood", folder), "02_ddp",
                  ["--no-hidden"]),
    }


def run(sub: Path, lab: str, options: list[str], budget: float, out: Path) -> dict:
    sys.path.insert(0, str(ROOT))
    from autograder.report import validate_results

    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "autograder", "grade", str(sub), "--lab", lab,
                    "--timeout", f"{budget:g}", "--json", str(out), "--no-color", *options],
                   capture_output=True, text=True, cwd=ROOT)
    took = time.monotonic() - start
    data = json.loads(out.read_text())
    return {"took": took, "score": data["score"], "valid": validate_results(data) == []}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timeout", type=float, default=30.0, help="the grade's budget, seconds")
    ap.add_argument("--runs", type=int, default=3, help="runs of each provocation")
    ap.add_argument("--only", default="launch,judge,flood", help="comma-separated provocations")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cases = provocations(Path(tmp))
        for name in args.only.split(","):
            sub, lab, options = cases[name]
            for k in range(args.runs):
                m = run(sub, lab, options, args.timeout, Path(tmp) / f"{name}-{k}.json")
                print(f"{name}: --timeout {args.timeout:g}: ended after {m['took']:.1f} s "
                      f"({m['took'] - args.timeout:+.1f} s), score {m['score']:g}, "
                      f"results.json {'valid' if m['valid'] else 'INVALID'}", flush=True)


if __name__ == "__main__":
    main()
