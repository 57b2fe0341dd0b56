"""Offloaded optimizer steps: bytes moved and step time, measured beside the models.

For each tier of `toolkit.experiments.offload` (host memory, a memory-mapped file served by the
page cache, the same file cold so that every read and write reaches the disk) and an emulated
link (`ThrottledStore` in front of host memory, `--link-gbs`), one flat parameter of `--numel`
elements trains with `OffloadOptimizer` (fp32 Adam, chunks of `--chunk` elements) with and
without prefetch. The two take turns step by step, on identical parameters, so that a busy
moment of the machine falls on both. Printed per (tier, prefetch):

    bytes read / written per step     measured by the store, and toolkit.cost.offload.step_bytes
    step time                         median [q25-q75] over the steps after the first
    CPU time                          median process CPU time of those steps (both threads): on a
                                      machine loaded past its cores the wall time is mostly
                                      waiting for a core, the CPU time is not
    model                             toolkit.cost.offload.step_time, from the α-β of each tier
                                      (measure_tiers at the chunk's size and below) and of the
                                      update (measure_update: chunks where they really run)
    measured / model                  the ratio of the medians

Usage: python benchmarks/offload_step.py [--numel 8388608] [--chunk 1048576] [--steps 9]
                                         [--link-gbs 1.0]
Take timings with `nice -n -20` on a shared machine; they still vary by tens of percent.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
import torch
from torch import nn

from toolkit.cost import AlphaBeta
from toolkit.cost.offload import TierLink, step_bytes, step_time
from toolkit.experiments.offload import (
    TIER_CASES, fit_link, fit_tiers, measure_tiers, measure_update, one_thread,
)
from toolkit.offload import OffloadOptimizer, ThrottledStore, make_store

EMULATED = "emulated link"


def _stores(case: str, folder: str, link: AlphaBeta):
    tier, cold = ("cpu", False) if case == EMULATED else (case.split()[0], case.endswith("cold"))
    store = make_store(tier, folder=folder, cold=cold)
    if case == EMULATED:
        store = ThrottledStore(store, latency=link.alpha, bandwidth=link.bandwidth)
    return store


def run_case(case: str, args: argparse.Namespace, link: AlphaBeta
             ) -> tuple[dict[bool, list], dict[bool, list[float]]]:
    """Steps of prefetch off and on, taking turns; each one's `StepStats` and CPU seconds."""
    gen = torch.Generator().manual_seed(0)
    start = torch.randn(args.numel, generator=gen)
    params = {p: nn.Parameter(start.clone()) for p in (False, True)}
    stats: dict[bool, list] = {False: [], True: []}
    cpu: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="offload-bench-") as folder:
        opts = {p: OffloadOptimizer([params[p]], torch.optim.Adam, lr=1e-3, prefetch=p,
                                    chunk_numel=args.chunk, store=_stores(case, folder, link))
                for p in (False, True)}
        try:
            for _ in range(args.steps):
                grad = torch.randn(args.numel, generator=gen)
                for p in (False, True):
                    params[p].grad = grad
                    start = time.process_time()
                    opts[p].step()
                    cpu[p].append(time.process_time() - start)
                    stats[p].append(opts[p].last_step)
        finally:
            for opt in opts.values():
                opt.close()
    assert torch.equal(params[False], params[True])  # prefetch changes the time, not the bits
    return stats, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--numel", type=int, default=1 << 23)
    parser.add_argument("--chunk", type=int, default=1 << 20)
    parser.add_argument("--steps", type=int, default=9)
    parser.add_argument("--link-gbs", type=float, default=1.0)
    args = parser.parse_args()
    chunk_bytes = 4 * args.chunk
    sizes = (chunk_bytes // 4, chunk_bytes // 2, chunk_bytes)
    print(f"fp32 Adam on {args.numel:,} elements in chunks of {args.chunk:,} "
          f"({args.numel * 4 / 1e6:.0f} MB of parameters, {8 * args.numel / 1e6:.0f} MB of "
          f"states offloaded); {args.steps} steps per variant, the first not timed")
    fits = fit_tiers(measure_tiers(sizes, repeats=7, arena=max(64 << 20, 4 * chunk_bytes)))
    link = AlphaBeta(alpha=50e-6, beta=1 / (args.link_gbs * 1e9))
    fits[EMULATED] = TierLink(EMULATED, link, link)
    update = measure_update((args.chunk // 4, args.chunk // 2, args.chunk),
                            numel=args.numel // 2)
    ulink = fit_link(update.numel, update.seconds)
    print("\nα-β fits (one transfer of n bytes: α + n/bandwidth; the update per element):")
    for name, tl in fits.items():
        print(f"  {name:14s} read  {tl.read}\n  {'':14s} write {tl.write}")
    print(f"  {'update':14s} α = {ulink.alpha * 1e6:.1f} µs, "
          f"{1 / ulink.beta / 1e6:.0f} M elements/s")
    chunks = [min(args.chunk, args.numel - lo) for lo in range(0, args.numel, args.chunk)]
    print(f"\n{'tier':14s} {'prefetch':8s} {'read MB':>8s} {'written MB':>10s} "
          f"{'= model':>7s} {'step ms: median [q25-q75]':>27s} {'CPU ms':>7s} {'model ms':>9s} "
          f"{'meas./model':>11s} {'CPU/model':>9s}")
    with one_thread():
        for case in (*TIER_CASES, EMULATED):
            stats, cpu = run_case(case, args, link)
            for prefetch in (False, True):
                steps = stats[prefetch]
                want = [step_bytes(args.numel, state_bytes=8, first=i == 0)
                        for i in range(len(steps))]
                exact = [(s.bytes_read, s.bytes_written) for s in steps] == want
                times = np.array([s.seconds for s in steps[1:]]) * 1e3
                q25, med, q75 = np.percentile(times, [25, 50, 75])
                cpu_ms = float(np.median(cpu[prefetch][1:])) * 1e3
                model = step_time(chunks, tier=fits[case], update=ulink, read_bytes=8,
                                  write_bytes=8, tensors=2, prefetch=prefetch).seconds * 1e3
                print(f"{case:14s} {'on' if prefetch else 'off':8s} "
                      f"{steps[-1].bytes_read / 1e6:8.1f} {steps[-1].bytes_written / 1e6:10.1f} "
                      f"{'yes' if exact else 'NO':>7s} {med:9.1f} [{q25:.1f}-{q75:.1f}]"
                      f"{'':>5s} {cpu_ms:7.1f} {model:9.1f} {med / model:11.2f} "
                      f"{cpu_ms / model:9.2f}")


if __name__ == "__main__":
    main()
