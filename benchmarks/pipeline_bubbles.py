"""Measured pipeline bubbles against the formula, and activation memory GPipe vs 1F1B.

For p ∈ {2, 4} stages, m ∈ {1, 4, 8} micro-batches, GPipe and 1F1B, one training step of a
4-block model runs on p gloo ranks (`toolkit.pipeline.run_pipeline`), with m micro-batches of
`--rows` samples each (so every op takes the same time whatever m). Printed side by side:

1. the bubble (idle fraction 1 − busy / (p · makespan)) measured from the executor's per-op
   timestamps, median of `--repeats` runs, next to (p−1)/(m+p−1) (Huang et al. 2019;
   Narayanan et al. 2021) and the relative difference; "ideal" is the simulator fed with the
   run's own mean op times per stage, so the gap between it and "measured" is communication
   and waiting (each message costs ~0.1 ms on an idle machine, several ms when other
   processes keep the cores busy: the load average is printed);
2. the peak bytes of saved activations per stage (counted with saved_tensors_hooks while the
   step runs), GPipe against 1F1B, with the ratio the theory predicts: m / min(p − r, m).

Fair timing on a shared 2-core machine: each block's compute is a `Delay` layer that *sleeps*
a fixed time per sample (forward `--forward` ms, backward twice that), so 4 ranks on 2 cores do
not take turns on the CPU, and ops of 60-240 ms dwarf the messages' latency. Shorter ops
(`--forward 2.5`) show the latency: the measured bubble grows above the formula. With real
matrix products instead (`--busy`), ranks share cores and the measured bubble shows the OS
scheduler as much as the schedule. A full run takes about a minute.

Usage: python benchmarks/pipeline_bubbles.py [--repeats 3] [--forward 30] [--rows 2]
       [--width 256] [--busy] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
from torch import nn

from toolkit.pipeline import (
    bubble_fraction, delay_blocks, make_schedule, peak_activations, run_pipeline, simulate,
    stage_times,
)

BLOCKS = 4                  # model depth in blocks: p = 2 gets 2 per stage, p = 4 one
SCHEDULES = ("gpipe", "1f1b")


class Busy(nn.Module):
    """Real compute instead of sleep: `reps` (width × width) matrix products per call."""

    def __init__(self, width: int, reps: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.eye(width) * 0.99, requires_grad=False)
        self.reps = reps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.reps):
            x = x @ self.w
        return x


def model(args: argparse.Namespace) -> list[nn.Module]:
    if not args.busy:
        return delay_blocks(BLOCKS, width=args.width, forward=args.forward / 1e3,
                            backward=2 * args.forward / 1e3)
    torch.manual_seed(0)
    return [nn.Sequential(nn.Linear(args.width, args.width), Busy(args.width, 40))
            for _ in range(BLOCKS)]


def measure(args: argparse.Namespace) -> list[dict]:
    layers = model(args)
    rows = []
    for p in (2, 4):
        for m in (1, 4, 8):
            batch = m * args.rows
            x, y = torch.randn(batch, args.width), torch.randn(batch, args.width)
            for name in SCHEDULES:
                runs = [run_pipeline(layers, x, y, schedule=name, p=p, m=m, timeout=120)
                        for _ in range(args.repeats)]
                bubbles = [r.bubble for r in runs]
                best = runs[bubbles.index(statistics.median(bubbles))] if args.repeats % 2 \
                    else runs[0]
                f, b = stage_times(best.table, per_stage=True)
                ideal = simulate(make_schedule(name, p=p, m=m), forward=f, backward=b).bubble
                rows.append(dict(
                    p=p, m=m, schedule=name, formula=bubble_fraction(name, p=p, m=m),
                    measured=statistics.median(bubbles), ideal=ideal,
                    makespan_ms=statistics.median(r.makespan for r in runs) * 1e3,
                    peak_bytes=best.peak_bytes, mb_bytes=best.mb_bytes[0][0, 0]))
    return rows


def report(rows: list[dict]) -> str:
    by = {(r["p"], r["m"], r["schedule"]): r for r in rows}
    lines = ["Bubble (idle fraction of the step): formula (p-1)/(m+p-1) vs measured (median)",
             f"{'p':>2} {'m':>2} {'formula':>8} | {'GPipe':>7} {'rel':>6} {'ideal':>6} "
             f"{'ms':>6} | {'1F1B':>7} {'rel':>6} {'ideal':>6} {'ms':>6}"]
    for p in (2, 4):
        for m in (1, 4, 8):
            g, o = by[p, m, "gpipe"], by[p, m, "1f1b"]
            cells = []
            for r in (g, o):
                rel = (r["measured"] - r["formula"]) / r["formula"]
                cells.append(f"{r['measured']:7.3f} {rel:+6.1%} {r['ideal']:6.3f} "
                             f"{r['makespan_ms']:6.0f}")
            lines.append(f"{p:>2} {m:>2} {g['formula']:8.3f} | " + " | ".join(cells))
    worst = max(abs(r["measured"] - r["formula"]) / r["formula"] for r in rows)
    lines.append(f"largest relative difference: {worst:.1%} (goal: within 10%)")
    lines += ["", "Peak saved activations per stage, KB (GPipe vs 1F1B; theory: ratio "
              "m / min(p-r, m))",
              f"{'p':>2} {'m':>2} {'stage':>5} | {'GPipe':>8} {'1F1B':>8} {'ratio':>6} "
              f"{'theory':>6}"]
    for p in (2, 4):
        for m in (1, 4, 8):
            g, o = by[p, m, "gpipe"], by[p, m, "1f1b"]
            for r in range(p):
                theory = (peak_activations("gpipe", p=p, m=m, stage=r)
                          / peak_activations("1f1b", p=p, m=m, stage=r))
                lines.append(f"{p:>2} {m:>2} {r:>5} | {g['peak_bytes'][r] / 1e3:8.1f} "
                             f"{o['peak_bytes'][r] / 1e3:8.1f} "
                             f"{g['peak_bytes'][r] / o['peak_bytes'][r]:6.2f} {theory:6.2f}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="runs per configuration (median)")
    ap.add_argument("--forward", type=float, default=30.0,
                    help="ms of forward per sample per block (backward: twice that)")
    ap.add_argument("--rows", type=int, default=2, help="samples per micro-batch")
    ap.add_argument("--width", type=int, default=256, help="features per sample")
    ap.add_argument("--busy", action="store_true", help="real matmuls instead of sleeps")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    t0 = time.perf_counter()
    rows = measure(args)
    print(f"{BLOCKS} blocks of Linear({args.width}, {args.width}) + "
          + ("40 matmuls (busy)" if args.busy else
             f"Delay({args.forward:g} ms/sample fwd, {2 * args.forward:g} ms bwd)")
          + f", {args.rows} samples per micro-batch, {args.repeats} runs each; gloo on "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start\n")
    print(report(rows))
    print(f"\n({time.perf_counter() - t0:.0f} s; load average {os.getloadavg()[0]:.1f} at the end)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1, default=str)


if __name__ == "__main__":
    main()
