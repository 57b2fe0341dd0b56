"""Measured pipeline bubbles against the formula: GPipe and 1F1B, ZB-H1, Chimera; memory.

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
scheduler as much as the schedule. The classic part takes about a minute.

`--part zb` measures ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): the
blocks' `Delay` sleeps t_F forward, t_B on the input-gradient path and t_W on the weight-gradient
path (`--times`, ms per sample, one or more "F/B/W" triples), so 1F1B's backward takes t_B + t_W
and ZB-H1 runs B and W as separate ops. For p ∈ {2, 4}, m ∈ {4, 8}: the measured bubble of both
(median of `--repeats`) next to the paper's idle time per stage, (p−1)(t_F + t_B + t_W) for
1F1B and (p−1)(t_F + t_B − t_W) for ZB-H1 (section 2.3, Table 2), as a fraction of the step; the
simulator fed with the run's own op times ("ideal"); and the peak activation bytes per stage
(ZB-H1 keeps every micro-batch's graph and output gradients from its B to its W). `--part
chimera` runs Chimera (Li & Hoefler, SC 2021) with equal forward and backward against its
count, (p−2)/(2m+p−2), and 1F1B on the same model. `--part all` runs everything.

Usage: python benchmarks/pipeline_bubbles.py [--part classic|zb|chimera|all] [--repeats 3]
       [--forward 30] [--times 20/20/20,30/30/15] [--rows 2] [--width 256] [--busy]
       [--json out.json] [--save | --record FILE.json]
``--save`` records each part's rows in benchmarks/results/pipeline_bubbles.json (`saved`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

from toolkit.pipeline import (
    bubble_fraction, delay_blocks, make_schedule, peak_activations, run_pipeline, simulate,
    stage_times,
)
from toolkit.pipeline.catalog import key

sys.path.insert(0, str(Path(__file__).resolve().parent))
import saved  # noqa: E402  (benchmarks/saved.py)

ABOUT = ("Per part (classic: GPipe and 1F1B; zb: 1F1B and ZB-H1; chimera: 1F1B and Chimera), "
         "one row per (p, m, schedule): the bubble's formula, the measured bubble (median of "
         "the repeats), the simulator's with the run's op times (ideal), the step in ms and "
         "the peak activation bytes per stage. benchmarks/pipeline_bubbles.py --save.")
SAVED_FIELDS = ("times", "p", "m", "schedule", "formula", "measured", "low", "high", "ideal",
                "makespan_ms", "peak_bytes")

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


def _median_run(layers, x, y, name: str, p: int, m: int, repeats: int):
    """`repeats` runs; (the run with the median bubble, every bubble, every makespan)."""
    runs = [run_pipeline(layers, x, y, schedule=name, p=p, m=m, timeout=120)
            for _ in range(repeats)]
    order = sorted(range(len(runs)), key=lambda i: runs[i].bubble)
    return (runs[order[len(runs) // 2]], [r.bubble for r in runs], [r.makespan for r in runs])


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}, {max(values):.3f}]"


def measure_split(args: argparse.Namespace, triples: list[tuple[float, float, float]]
                  ) -> list[dict]:
    """1F1B and ZB-H1 on Delay blocks with separate B and W sleeps (see the docstring)."""
    rows = []
    for f, b, w in triples:
        layers = delay_blocks(BLOCKS, width=args.width, forward=f / 1e3, backward=b / 1e3,
                              weight=w / 1e3)
        for p in (2, 4):
            for m in (4, 8):
                batch = m * args.rows
                x, y = torch.randn(batch, args.width), torch.randn(batch, args.width)
                per_stage = BLOCKS // p * args.rows        # ms of each op per ms/sample/block
                times = dict(forward=f * per_stage, backward=b * per_stage,
                             weight=w * per_stage)
                for name in ("1f1b", "zb-h1"):
                    best, bubbles, spans = _median_run(layers, x, y, name, p, m, args.repeats)
                    if name == "1f1b":   # the paper's 1F1B row: the whole backward is B + W
                        formula = bubble_fraction(name, p=p, m=m)
                    else:
                        formula = bubble_fraction(name, p=p, m=m, **times)
                    fw, bw, ww = stage_times(best.table, weight=True, per_stage=True)
                    ideal = simulate(best.schedule, forward=fw, backward=bw, weight=ww).bubble
                    rows.append(dict(times=f"{f:g}/{b:g}/{w:g}", p=p, m=m, schedule=name,
                                     formula=formula, measured=statistics.median(bubbles),
                                     low=min(bubbles), high=max(bubbles), ideal=ideal,
                                     makespan_ms=statistics.median(spans) * 1e3,
                                     peak_bytes=best.peak_bytes))
    return rows


def report_split(rows: list[dict]) -> str:
    lines = ["ZB-H1 vs 1F1B: bubble = idle fraction of the step; formula = Qi et al. Table 2 "
             "((p-1)(tF+tB+tW) vs (p-1)(tF+tB-tW) idle per stage); measured = median "
             "[min, max]; ideal = simulator with the run's op times",
             f"{'tF/tB/tW':>9} {'p':>2} {'m':>2} {'schedule':>8} | {'formula':>7} "
             f"{'measured (median [min, max])':>29} {'rel':>6} {'ideal':>6} {'ms':>6} | "
             f"peak KB per stage"]
    for r in rows:
        rel = (r["measured"] - r["formula"]) / r["formula"]
        spread = _spread([r["low"], r["measured"], r["high"]])
        lines.append(f"{r['times']:>9} {r['p']:>2} {r['m']:>2} {r['schedule']:>8} | "
                     f"{r['formula']:7.3f} {spread:>29} {rel:+6.1%} {r['ideal']:6.3f} "
                     f"{r['makespan_ms']:6.0f} | "
                     + " ".join(f"{b / 1e3:.1f}" for b in r["peak_bytes"]))
    zb = [r for r in rows if r["schedule"] == "zb-h1"]
    worst = max(abs(r["measured"] - r["formula"]) / r["formula"] for r in zb)
    lines.append(f"ZB-H1: largest relative difference measured vs formula {worst:.1%}")
    by = {(r["times"], r["p"], r["m"], r["schedule"]): r for r in rows}
    cut = [1 - by[t, p, m, "zb-h1"]["makespan_ms"] / by[t, p, m, "1f1b"]["makespan_ms"]
           for (t, p, m, name) in by if name == "1f1b"]
    lines.append(f"ZB-H1 step time below 1F1B's by {min(cut):.1%} … {max(cut):.1%}")
    return "\n".join(lines)


def measure_chimera(args: argparse.Namespace) -> list[dict]:
    """Chimera and 1F1B with forward = backward (the paper's drawing), median bubbles."""
    layers = delay_blocks(BLOCKS, width=args.width, forward=args.forward / 1e3,
                          backward=args.forward / 1e3)
    rows = []
    for p, m in ((2, 2), (4, 4), (4, 8)):
        x, y = torch.randn(m * args.rows, args.width), torch.randn(m * args.rows, args.width)
        for name in ("1f1b", "chimera"):
            best, bubbles, spans = _median_run(layers, x, y, name, p, m, args.repeats)
            f, b = stage_times(best.table, v=1, per_stage=True)
            rows.append(dict(p=p, m=m, schedule=name, measured=statistics.median(bubbles),
                             low=min(bubbles), high=max(bubbles),
                             formula=bubble_fraction(key(name), p=p, m=m),
                             ideal=simulate(best.schedule, forward=f, backward=b).bubble,
                             makespan_ms=statistics.median(spans) * 1e3,
                             peak_bytes=best.peak_bytes))
    return rows


def report_chimera(rows: list[dict]) -> str:
    lines = ["Chimera vs 1F1B, forward = backward: formula (p-2)/(2m+p-2) vs (p-1)/(m+p-1); "
             "Chimera's m = 2p runs two units back to back (the formula's value needs their "
             "fills and drains to overlap)",
             f"{'p':>2} {'m':>2} {'schedule':>8} | {'formula':>7} "
             f"{'measured (median [min, max])':>29} {'ideal':>6} {'ms':>6} | peak KB per stage"]
    for r in rows:
        lines.append(f"{r['p']:>2} {r['m']:>2} {r['schedule']:>8} | {r['formula']:7.3f} "
                     f"{_spread([r['low'], r['measured'], r['high']]):>29} {r['ideal']:6.3f} "
                     f"{r['makespan_ms']:6.0f} | "
                     + " ".join(f"{b / 1e3:.1f}" for b in r["peak_bytes"]))
    return "\n".join(lines)


def plain(rows: list[dict]) -> list[dict]:
    """`rows` with the saved fields only, as JSON numbers."""
    def number(v):
        return v if isinstance(v, str) else [int(b) for b in v] if isinstance(v, list) \
            else float(v) if isinstance(v, float) else int(v)
    return [{k: number(r[k]) for k in SAVED_FIELDS if k in r} for r in rows]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="runs per configuration (median)")
    ap.add_argument("--forward", type=float, default=30.0,
                    help="ms of forward per sample per block (backward: twice that)")
    ap.add_argument("--rows", type=int, default=2, help="samples per micro-batch")
    ap.add_argument("--width", type=int, default=256, help="features per sample")
    ap.add_argument("--busy", action="store_true", help="real matmuls instead of sleeps")
    ap.add_argument("--part", choices=("classic", "zb", "chimera", "all"), default="classic",
                    help="which measurement (see the module docstring)")
    ap.add_argument("--times", default="20/20/20,30/30/15",
                    help="ZB-H1: comma-separated tF/tB/tW triples, ms per sample per block")
    ap.add_argument("--json", help="also write the rows here")
    saved.add_arguments(ap, "pipeline_bubbles")
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.forward <= 0 or args.rows < 1:
        ap.error("--repeats and --rows must be >= 1, --forward > 0")
    save_to = saved.target(ap, args, "pipeline_bubbles")
    t0, load_before = time.perf_counter(), saved.load_average()
    print(f"{BLOCKS} blocks of Linear({args.width}, {args.width}) + Delay, {args.rows} samples "
          f"per micro-batch, {args.repeats} runs each; gloo on {os.cpu_count()} cores, load "
          f"average {os.getloadavg()[0]:.1f} at the start\n")
    out: dict[str, list[dict]] = {}
    if args.part in ("classic", "all"):
        out["classic"] = rows = measure(args)
        print(("40 matmuls per block (busy)\n" if args.busy else
               f"Delay({args.forward:g} ms/sample fwd, {2 * args.forward:g} ms bwd)\n")
              + report(rows) + "\n")
    if args.part in ("zb", "all"):
        triples = [tuple(float(t) for t in triple.split("/")) for triple in
                   args.times.split(",")]
        out["zb"] = rows = measure_split(args, triples)
        print(report_split(rows) + "\n")
    if args.part in ("chimera", "all"):
        out["chimera"] = rows = measure_chimera(args)
        print(report_chimera(rows) + "\n")
    print(f"({time.perf_counter() - t0:.0f} s; load average {os.getloadavg()[0]:.1f} at the end)")
    for part, rows in out.items():
        saved.record(save_to, "pipeline_bubbles", part,
                     {"busy": args.busy, "forward_ms": args.forward, "repeats": args.repeats,
                      "rows": plain(rows)}, about=ABOUT, load_before=load_before, argv=argv)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1, default=str)


if __name__ == "__main__":
    main()
