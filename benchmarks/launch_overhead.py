"""Figures for the launcher and the recorder, side by side in one run.

1. Time from `spawn(...)` to results for N ranks doing one small all_reduce:
   - from a script (this process), fork and spawn start methods;
   - from a notebook cell (a real Jupyter kernel driven by nbclient).
2. Cost of the recorder on 1,000 small all_reduces per rank: the unwrapped torch function, the
   wrapper idle (what every spawned rank pays: it posts to the in-flight board), and recording.

Usage: python benchmarks/launch_overhead.py [--ranks 4] [--repeats 10] [--calls 1000]
                                          [--json out.json] [--save | --record FILE.json]
Times vary ±30 % on a shared 2-core machine: read the ratios, and run it twice. ``--save``
records the figures in benchmarks/results/launch_overhead.json (`saved`), where
docs/figures.md reads them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from toolkit import comm
from toolkit.launch import spawn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import saved  # noqa: E402  (benchmarks/saved.py)

ABOUT = ("spawn(...) to results for N ranks doing one small all_reduce, seconds (median, min, "
         "max over launches) from a script (fork and spawn start methods) and a notebook cell; "
         "the recorder's cost in seconds per all_reduce call on 1-N ranks; the wrapper's own "
         "cost around a no-op, seconds per call. benchmarks/launch_overhead.py --save.")


def one_all_reduce(rank: int, world_size: int) -> float:
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return t.item()


def time_spawn(world_size: int, repeats: int, start_method: str) -> list[float]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = spawn(one_all_reduce, world_size, start_method=start_method, echo=False, timeout=120)
        times.append(time.perf_counter() - t0)
        assert out == [float(sum(range(world_size)))] * world_size
    return times


NOTEBOOK_CELLS = [
    "import json, time, torch, torch.distributed as dist\nfrom toolkit.launch import spawn",
    "def one_all_reduce(rank, world_size):\n"
    "    t = torch.tensor([float(rank)])\n"
    "    dist.all_reduce(t)\n"
    "    return t.item()",
    "times = []\n"
    "for _ in range({repeats}):\n"
    "    t0 = time.perf_counter()\n"
    "    spawn(one_all_reduce, {ranks}, echo=False)\n"
    "    times.append(time.perf_counter() - t0)\n"
    "print('TIMES', json.dumps(times))",
]


def time_notebook(world_size: int, repeats: int) -> list[float]:
    import nbclient
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c.format(repeats=repeats, ranks=world_size))
                for c in NOTEBOOK_CELLS]
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3").execute()
    for out in nb.cells[-1].outputs:
        for line in out.get("text", "").splitlines():
            if line.startswith("TIMES "):
                return json.loads(line[len("TIMES "):])
    raise RuntimeError(f"the notebook printed no timings: {nb.cells[-1].outputs}")


def recorder_cost(rank: int, world_size: int, calls: int, rounds: int) -> dict[str, float]:
    """Seconds per all_reduce call in each mode (median over rounds, modes interleaved)."""
    plain = comm.original("all_reduce")
    x = torch.ones(1)

    def loop(fn) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(x)
        return (time.perf_counter() - t0) / calls

    samples: dict[str, list[float]] = {"unwrapped": [], "wrapper, not recording": [],
                                       "recording": []}
    for _ in range(rounds):
        samples["unwrapped"].append(loop(plain))
        samples["wrapper, not recording"].append(loop(dist.all_reduce))
        with comm.recording():
            samples["recording"].append(loop(dist.all_reduce))
    return {k: statistics.median(v) for k, v in samples.items()}


def wrapper_alone(calls: int = 100_000) -> dict[str, float]:
    """Seconds per call of the wrapper around a no-op stand-in for all_reduce: its own cost,
    free of the communication's jitter. Run in one rank, so the in-flight board is attached."""
    import tempfile

    from toolkit.comm import patch

    def noop(tensor, op=None, group=None, async_op=False):
        return None

    wrapped = patch._make_wrapper("all_reduce", noop, patch.SPECS["all_reduce"])
    x = torch.ones(1)
    out = {}
    with tempfile.TemporaryDirectory() as d:
        board = comm.InflightBoard(f"{d}/board", 1, create=True)
        for label, fn, attach, record in [("no-op itself", noop, False, False),
                                          ("wrapper, idle", wrapped, False, False),
                                          ("wrapper + in-flight board", wrapped, True, False),
                                          ("wrapper + board + recording", wrapped, True, True)]:
            comm.attach(0, board if attach else None)
            with comm.recording(max_events=calls) if record else _nothing():
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn(x)
                out[label] = (time.perf_counter() - t0) / calls
        comm.detach()
        board.close()
    return out


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=4, help="ranks per launch (default 4)")
    ap.add_argument("--repeats", type=int, default=10, help="launches timed per path (default 10)")
    ap.add_argument("--calls", type=int, default=1000, help="all_reduces per recorder round")
    ap.add_argument("--json", help="also write the figures to this file")
    saved.add_arguments(ap, "launch_overhead")
    args = ap.parse_args(argv)
    if args.ranks < 1 or args.repeats < 1 or args.calls < 1:
        ap.error("--ranks, --repeats and --calls must be >= 1")
    save_to = saved.target(ap, args, "launch_overhead")
    load_before = saved.load_average()
    p, n = args.ranks, args.repeats
    print(f"torch {torch.__version__}, {p} ranks, gloo on CPU, {n} launches per path\n", flush=True)

    rows = []
    spawn(one_all_reduce, p, echo=False)  # warm the page cache and the OS
    for label, fn in [("script, fork", lambda: time_spawn(p, n, "fork")),
                      ("notebook cell, fork (auto)", lambda: time_notebook(p, n)),
                      ("script, spawn", lambda: time_spawn(p, max(2, n // 5), "spawn"))]:
        print(f"  timing {label} ...", flush=True)
        t = fn()
        rows.append({"path": label, "median_s": statistics.median(t), "min_s": min(t),
                     "max_s": max(t), "launches": len(t)})
    print(f"\nspawn(...) to results, {p} ranks, one small all_reduce")
    print(f"{'path':<30}{'median s':>10}{'min s':>10}{'max s':>10}")
    for r in rows:
        print(f"{r['path']:<30}{r['median_s']:>10.3f}{r['min_s']:>10.3f}{r['max_s']:>10.3f}")

    print(f"\nrecorder cost: {args.calls} all_reduces of 4 bytes per rank, median of 5 rounds")
    print(f"{'ranks':<7}{'mode':<26}{'us/call':>10}{'vs unwrapped':>14}")
    recorder = {}
    for world in sorted({1, 2, p}):
        costs = spawn(recorder_cost, world, args.calls, 5, echo=False, timeout=300)
        per_mode = {m: statistics.median(c[m] for c in costs) for m in costs[0]}
        recorder[world] = per_mode
        for m, v in per_mode.items():
            print(f"{world:<7}{m:<26}{v * 1e6:>10.1f}{v / per_mode['unwrapped']:>13.2f}x")

    alone = wrapper_alone()
    print("\nthe wrapper's own cost (around a no-op, 100,000 calls, one process)")
    for label, v in alone.items():
        print(f"  {label:<30}{v * 1e6:>8.2f} us/call")

    saved.record(save_to, "launch_overhead", f"{p} ranks", {
        "ranks": p, "launch": rows,
        "recorder_s_per_call": {str(w): v for w, v in recorder.items()},
        "wrapper_alone_s_per_call": alone}, about=ABOUT, load_before=load_before, argv=argv)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "ranks": p, "launch": rows,
                       "recorder_s_per_call": recorder,
                       "wrapper_alone_s_per_call": alone}, f, indent=2)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    sys.exit(main())
