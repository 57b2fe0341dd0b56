"""CPU time per collective call, by thread and summed over the ranks: where a call's time goes.

    python benchmarks/collective_cpu.py                 # all-reduce, 1/16/64 MB, 2 and 4 ranks
    python benchmarks/collective_cpu.py --sizes 1M --world-sizes 4 --algorithms sliced_ring,torch

On a 2-core machine shared with others, the wall time of a latency-bound collective swings by
several times (another process holds a core), so `benchmarks/collectives.py` needs a quiet
machine. The CPU a call costs holds better, and with more ranks than cores it is what the wall
time becomes. Each thread's CPU is read from ``/proc/self/task/<tid>/schedstat`` (nanoseconds
on a CPU, Linux) before and after k back-to-back calls, and summed per kind over the ranks:

* ``main``: the rank's Python thread (the toolkit's algorithms, their adds, posting messages;
  for torch's built-in only the enqueue and the wait);
* ``gloo_tcp_loop``: gloo's transport thread, which reads and writes the sockets (it also
  spins on ``epoll_wait`` while another thread holds the lock of the connection it must read);
* ``pt_gloo_runloop``: torch's gloo worker, which runs torch's own collectives.

Rounds alternate the algorithms (rotated order); the table gives, per algorithm, the median over
rounds of the CPU per call summed over ranks and threads, its interquartile range, and the
median per thread kind. Run it as root with ``nice -n -20`` where others share the machine.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from benchmarks.collectives import parse_sizes  # noqa: E402 (the same size syntax)
from toolkit import cost  # noqa: E402
from toolkit.cost.models import algorithms, split_label  # noqa: E402
from toolkit.cost.spread import spread  # noqa: E402
from toolkit.experiments.collectives import _buffers, _elements, _runner  # noqa: E402
from toolkit.launch import device, spawn  # noqa: E402

TRIAL_BYTES = 32 << 20
"""Bytes of collective input per trial: 32 calls of 1 MB, 2 of 16 MB, 1 of 64 MB."""


def thread_cpu() -> dict[str, int]:
    """Nanoseconds on a CPU so far, summed by thread kind, for this process."""
    out: dict[str, int] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            name = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
            ns = int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0])
        except OSError:  # the thread ended between the listing and the read
            continue
        kind = "main" if int(tid) == os.getpid() else name
        out[kind] = out.get(kind, 0) + ns
    return out


def _rank(rank: int, world_size: int, collective: str, labels: list[str], sizes: list[int],
          rounds: int) -> dict:
    """{(label, nbytes): [per round: {thread kind: CPU seconds per call}]} for this rank."""
    torch.set_num_threads(1)   # one add thread per rank: more ranks than cores already
    dtype, out = torch.float32, {}
    for nbytes in sizes:
        n = _elements(nbytes, dtype, world_size, collective)
        buffers = _buffers(collective, n, world_size, rank, dtype, device())
        runs = [_runner(collective, label, buffers) for label in labels]
        for run in runs:   # warm-up: connections, caches, the toolkit's scratch
            run()
            run()
        k = max(1, TRIAL_BYTES // nbytes)
        for i in range(rounds):
            for j in [(j + i) % len(runs) for j in range(len(runs))]:
                dist.barrier()
                before = thread_cpu()
                for _ in range(k):
                    runs[j]()
                after = thread_cpu()
                out.setdefault((labels[j], nbytes), []).append(
                    {kind: (ns - before.get(kind, 0)) / k / 1e9 for kind, ns in after.items()})
    return out


def measure(collective: str, labels: list[str], sizes: list[int], world_size: int,
            rounds: int) -> dict:
    """{(label, nbytes): (per-round totals over ranks and threads, {kind: per-round sums})}."""
    per_rank = spawn(_rank, world_size, collective, labels, sizes, rounds, timeout=1800)
    table = {}
    for key in per_rank[0]:
        kinds = sorted({kind for r in per_rank for d in r[key] for kind in d})
        by_kind = {kind: [sum(r[key][i].get(kind, 0.0) for r in per_rank)
                          for i in range(rounds)] for kind in kinds}
        totals = [sum(v[i] for v in by_kind.values()) for i in range(rounds)]
        table[key] = (totals, by_kind)
    return table


def print_table(table: dict, world_size: int, collective: str) -> None:
    print(f"\n# {collective}, {world_size} ranks: CPU ms per call over all ranks and threads, "
          "median [interquartile range] over rounds; then the median per thread kind")
    for (label, nbytes), (totals, by_kind) in table.items():
        s = spread(totals)
        kinds = "  ".join(f"{kind} {spread(v).median * 1e3:.3g}" for kind, v in by_kind.items()
                          if spread(v).median >= 5e-6)
        print(f"{cost.human_bytes(nbytes):>8} {label:<28} {s.median * 1e3:8.3g} "
              f"[{s.q25 * 1e3:.3g}-{s.q75 * 1e3:.3g}]   {kinds}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--collective", default="all_reduce", help="one of toolkit.cost.COEFFICIENTS")
    ap.add_argument("--algorithms", default="sliced_ring,ring,torch",
                    help="comma list; options after a colon (sliced_ring:slice_bytes=1048576)")
    ap.add_argument("--sizes", type=parse_sizes, default=parse_sizes("1M,16M,64M"),
                    help="bytes, as in benchmarks/collectives.py (default 1M,16M,64M)")
    ap.add_argument("--world-sizes", default="2,4", help="comma list of rank counts")
    ap.add_argument("--rounds", type=int, default=7, help="alternating rounds (default 7)")
    args = ap.parse_args(argv)
    if not Path("/proc/self/task").is_dir():
        ap.error("needs Linux: per-thread CPU comes from /proc/self/task/<tid>/schedstat")
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    if args.collective not in cost.COEFFICIENTS:
        ap.error(f"--collective: unknown {args.collective!r}; choose from "
                 f"{', '.join(cost.COEFFICIENTS)}")
    labels = args.algorithms.split(",")
    known = set(algorithms(args.collective)) | {cost.TORCH}
    for label in labels:
        if split_label(label)[0] not in known:
            ap.error(f"--algorithms: {args.collective} has no {label!r}; choose from "
                     f"{', '.join(sorted(known))}")
    print(f"{os.getloadavg()[0]:.2f} load, nice {os.nice(0)}; {TRIAL_BYTES >> 20} MB of input "
          "per trial", flush=True)
    for p in (int(w) for w in args.world_sizes.split(",")):
        print_table(measure(args.collective, labels, args.sizes, p, args.rounds), p,
                    args.collective)
    return 0


if __name__ == "__main__":
    sys.exit(main())
