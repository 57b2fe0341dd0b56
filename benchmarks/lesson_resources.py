"""Wall time and peak memory of each lesson run top to bottom in a fresh Jupyter kernel.

Memory is the peak of the summed PSS (proportional set size) of the kernel and every process
it started, sampled every 50 ms: forked ranks share most pages with the kernel, and PSS splits
shared pages between their users instead of counting them once per process as RSS would.
Binder gives about 2 GB and 1 CPU; the course promises well under a minute and 2 GB.

Usage: python benchmarks/lesson_resources.py [lessons/NN_x.ipynb ...] [--save-to DIR]
                                           [--csv FILE]
``--save-to`` keeps each executed notebook (outputs included); ``--csv`` writes the table; a
lesson that fails is reported on its line and the others still run (exit status 1). The
kernel inherits this process's environment: ``TOOLKIT_DEVICE=cuda`` runs the lessons' ranks on
the GPUs (`make gpu-check` does).
"""

from __future__ import annotations

import argparse
import csv
import threading
import time
from pathlib import Path

import nbclient
import nbformat
import psutil

ROOT = Path(__file__).resolve().parents[1]


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("lessons", nargs="*", type=Path, help="notebooks (default: every lesson)")
    ap.add_argument("--save-to", type=Path, help="folder for the executed notebooks")
    ap.add_argument("--csv", type=Path, help="write the table here")
    args = ap.parse_args(argv)
    paths = args.lessons or sorted((ROOT / "lessons").glob("*.ipynb"))
    if args.save_to:
        args.save_to.mkdir(parents=True, exist_ok=True)
    print(f"{'lesson':<36}{'wall s':>8}{'peak MB (PSS)':>15}  status", flush=True)
    rows = []
    for path in paths:
        try:
            wall, peak = run(path, save_to=args.save_to / path.name if args.save_to else None)
            status = "ok"
        except Exception as exc:  # noqa: BLE001 - a failed lesson is reported, the rest still run
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            wall, peak, status = float("nan"), 0, f"failed: {first}"
        print(f"{path.name:<36}{wall:>8.1f}{peak / 2**20:>15.0f}  {status}", flush=True)
        rows.append([path.name, round(wall, 1), round(peak / 2**20), status])
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            csv.writer(f).writerows([["lesson", "seconds", "peak MB (PSS)", "status"], *rows])
    return 0 if all(r[3] == "ok" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
