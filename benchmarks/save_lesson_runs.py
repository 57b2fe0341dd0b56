"""Regenerate the saved runs that lesson 03 (and lesson 04) load, so the lessons stay fast.

    nice -n -20 python benchmarks/save_lesson_runs.py            # all three, ~15-30 min on 2 cores
    nice -n -20 python benchmarks/save_lesson_runs.py slices     # one of them

Each is a `toolkit.cost.results` folder under lessons/data/runs/ written by
`benchmarks/collectives.py` (its method: alternating trials, medians, spreads, paired ratios):

* ``laptop-2core-gloo``: all-reduce, sliced ring / simple ring / torch's gloo, 4 KB-64 MB in ×2
  steps, 2 and 4 ranks (lesson 03's piecewise model and bus bandwidth; lesson 04's α and β);
* ``laptop-2core-gloo-slices``: all-reduce at 1, 16 and 64 MB, the sliced ring at slice sizes
  256 KB-32 MB beside the simple ring and torch (lesson 03's speed-up per slice count);
* ``laptop-2core-gloo-pieces``: reduce-scatter and all-gather (sliced ring / ring / torch) and
  broadcast (tree / torch), 4 KB-64 MB (lesson 03's FSDP pieces).

Run it as root with ``nice -n -20`` on a machine as quiet as you can get: meta.json records the
load before and after each run.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "lessons" / "data" / "runs"
COMMON = ["--world-sizes", "2,4", "--repeats", "9", "--max-repeats", "31", "--tolerance", "0.03"]
SAVED = {
    "main": ("laptop-2core-gloo",
             ["--collectives", "all_reduce", "--sizes", "4K:64M:2"]),
    "slices": ("laptop-2core-gloo-slices",
               ["--collectives", "all_reduce", "--algorithms", "ring,torch", "--sizes",
                "1M,16M,64M", "--slices", "256K,1M,2M,4M,8M,16M,32M"]),
    "pieces": ("laptop-2core-gloo-pieces",
               ["--collectives", "reduce_scatter,all_gather,broadcast", "--sizes", "4K:64M:2"]),
}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("runs", nargs="*", metavar="RUN",
                    help=f"which saved runs to regenerate: {', '.join(SAVED)} (default: all)")
    wanted = ap.parse_args(argv).runs or list(SAVED)
    if unknown := [w for w in wanted if w not in SAVED]:
        ap.error(f"unknown run(s) {', '.join(unknown)}: choose from {', '.join(SAVED)}")
    spec = importlib.util.spec_from_file_location("bench_collectives",
                                                  ROOT / "benchmarks" / "collectives.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    for key in wanted:
        folder, args = SAVED[key]
        print(f"\n=== {key}: lessons/data/runs/{folder}", flush=True)
        bench.main(args + COMMON + ["--out", str(RUNS / folder)])
        (RUNS / folder / "report.html").unlink()  # the lessons draw their own figures
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
