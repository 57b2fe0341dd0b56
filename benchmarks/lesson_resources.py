"""Wall time and peak memory of each lesson run top to bottom in a fresh Jupyter kernel.

Memory is the peak of the summed PSS (proportional set size) of the kernel and every process
it started, sampled every 50 ms: forked ranks share most pages with the kernel, and PSS splits
shared pages between their users instead of counting them once per process as RSS would.
Binder gives about 2 GB and 1 CPU; the course promises well under a minute and 2 GB.

Usage: python benchmarks/lesson_resources.py [lessons/NN_x.ipynb ...]
"""

from __future__ import annotations

import sys
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


def main() -> None:
    paths = [Path(p) for p in sys.argv[1:]] or sorted((ROOT / "lessons").glob("*.ipynb"))
    print(f"{'lesson':<36}{'wall s':>8}{'peak MB (PSS)':>15}")
    for path in paths:
        wall, peak = run(path)
        print(f"{path.name:<36}{wall:>8.1f}{peak / 2**20:>15.0f}", flush=True)


if __name__ == "__main__":
    main()
