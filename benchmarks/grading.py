"""Wall time of the autograder, end to end, as an instructor sees it.

1. One correct lab-01 submission through `autograder grade` (a fresh process: interpreter start,
   sandbox, every visible and hidden check on 2-4 ranks, results.json): median of `--repeats`.
2. A batch of `--batch` submissions (half correct, half the released stubs) with `--jobs 2`.

Usage: python benchmarks/grading.py [--repeats 3] [--batch 20] [--jobs 2]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "labs" / "01_collectives"


def _run(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, default=20)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-grading-"))
    try:
        one = [_run([sys.executable, "-m", "autograder", "grade", str(LAB / "collectives.py"),
                     "--lab", "01_collectives", "--json", str(work / "r.json")])
               for _ in range(args.repeats)]
        print(f"one correct lab-01 submission, `autograder grade` end to end: median "
              f"{statistics.median(one):.1f} s (min {min(one):.1f}, max {max(one):.1f}, "
              f"{args.repeats} runs; 11 checks, 59 cases on 2-4 ranks)")
        _run([sys.executable, "-m", "autograder", "release", "--lab", "01_collectives",
              "--out", str(work / "student")])
        subs = work / "subs"
        for i in range(args.batch):
            src = LAB if i % 2 == 0 else work / "student"
            (subs / f"s{i:02d}").mkdir(parents=True)
            shutil.copy(src / "collectives.py", subs / f"s{i:02d}" / "collectives.py")
        seconds = _run([sys.executable, "-m", "autograder", "batch", str(subs), "--lab",
                        "01_collectives", "--jobs", str(args.jobs), "--out", str(work / "out")])
        print(f"batch of {args.batch} (half correct, half stubs), --jobs {args.jobs}: "
              f"{seconds:.1f} s in all, {seconds / args.batch:.1f} s per submission")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
