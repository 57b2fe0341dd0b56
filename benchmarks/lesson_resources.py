"""Wall time and peak memory of each lesson run top to bottom in a fresh Jupyter kernel.

Memory is the peak of the summed PSS (proportional set size) of the kernel and every process
it started, sampled every 50 ms: forked ranks share most pages with the kernel, and PSS splits
shared pages between their users instead of counting them once per process as RSS would.
Binder gives about 2 GB and 1 CPU; the course promises well under a minute and 2 GB.

With ``--save`` each lesson's figures go into `MEASURED` (``--record FILE.json``: another) with
the machine they were taken on (cores, the load average just before and after, date, commit),
replacing that lesson's earlier entry and keeping the others'; `benchmarks/lesson_map.py` then
rewrites the lesson map's run-time column from it. The load average says how busy the machine
was: a run beside other work takes longer than on an idle machine.

Usage: python benchmarks/lesson_resources.py [lessons/NN_x.ipynb ...] [--save | --record FILE.json]
                                           [--save-to DIR] [--csv FILE]
``--save-to`` keeps each executed notebook (outputs included); ``--csv`` writes the table; a
lesson that fails is reported on its line and the others still run (exit status 1). The
kernel inherits this process's environment: ``TOOLKIT_DEVICE=cuda`` runs the lessons' ranks on
the GPUs (`make gpu-check` does).
"""

from __future__ import annotations

import argparse
import csv
import sys
import threading
import time
from pathlib import Path

import nbclient
import nbformat
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import saved  # noqa: E402  (benchmarks/saved.py)

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT / "benchmarks" / "results" / "lessons.json"
"""The measurements the lesson map shows (benchmarks/lesson_map.py writes them into it)."""


def tree_pss(pid: int) -> int:
    total = 0
    try:
        procs = [psutil.Process(pid)] + psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return 0
    for p in procs:
        try:
            total += p.memory_full_info().pss
        except psutil.Error:
            pass
    return total


def run(path: Path, save_to: Path | None = None) -> tuple[float, int]:
    """(wall seconds, peak PSS bytes) of `path` run top to bottom; with `save_to`, the executed
    notebook (outputs included, also when a cell failed) is written there."""
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}},
                                     store_widget_state=True)  # the site draws widgets from it
    peak = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            km = client.km
            pid = getattr(getattr(km, "provisioner", None), "pid", None) if km else None
            if pid:
                peak = max(peak, tree_pss(pid))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    t0 = time.perf_counter()
    sampler.start()
    try:
        client.execute()
    finally:
        stop.set()
        sampler.join()
        if save_to is not None:
            nbformat.write(nb, save_to)
    return time.perf_counter() - t0, peak


ABOUT = ("Each lesson run top to bottom in a fresh kernel by benchmarks/lesson_resources.py: "
         "wall seconds, peak PSS in MiB of the kernel and its ranks, and the machine (cores, "
         "1-minute load average just before and after the run). benchmarks/lesson_map.py writes "
         "them into the map.")


def save(path: Path, name: str, entry: dict) -> None:
    """Put one lesson's entry into the measurements file `path` (others' entries kept)."""
    saved.write(path, name, entry, about=ABOUT, section="lessons")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("lessons", nargs="*", type=Path, help="notebooks (default: every lesson)")
    ap.add_argument("--save", action="store_true", help="record each lesson's figures in "
                    f"{MEASURED.relative_to(ROOT)} (the lesson map's)")
    ap.add_argument("--record", type=Path, metavar="FILE.json", help="record them in FILE.json")
    ap.add_argument("--save-to", type=Path, metavar="DIR", help="folder for the executed notebooks")
    ap.add_argument("--csv", type=Path, help="write the table here")
    args = ap.parse_args(argv)
    target = args.record or (MEASURED if args.save else None)
    if target is not None and target.suffix != ".json":
        ap.error(f"--record {target}: expected a .json file")
    paths = args.lessons or sorted((ROOT / "lessons").glob("*.ipynb"))
    if args.save_to:
        args.save_to.mkdir(parents=True, exist_ok=True)
    print(f"{'lesson':<36}{'wall s':>8}{'peak MB (PSS)':>15}{'load before/after':>19}  status",
          flush=True)
    rows = []
    for path in paths:
        before = saved.load_average()
        try:
            wall, peak = run(path, save_to=args.save_to / path.name if args.save_to else None)
            status = "ok"
        except Exception as exc:  # noqa: BLE001 - a failed lesson is reported, the rest still run
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            wall, peak, status = float("nan"), 0, f"failed: {first}"
        after = saved.load_average()
        print(f"{path.name:<36}{wall:>8.1f}{peak / 2**20:>15.0f}{before:>11.1f} / {after:<5.1f}"
              f"  {status}", flush=True)
        rows.append([path.name, round(wall, 1), round(peak / 2**20), status])
        if target is not None and status == "ok":
            save(target, path.name, {
                "wall_s": round(wall, 1), "peak_mib": round(peak / 2**20),
                **saved.machine(before)})
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            csv.writer(f).writerows([["lesson", "seconds", "peak MB (PSS)", "status"], *rows])
    return 0 if all(r[3] == "ok" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
