"""Bytes of model states each rank holds, measured, beside what `toolkit.memory` predicts.

For every method (replicated data parallel, ZeRO-1, ZeRO-2, our FSDP, torch's FSDP2
`fully_shard`) and world size, train a TinyGPT (`toolkit.experiments.memory.DEFAULT_CONFIG`) for a
few steps of fp32 Adam on real gloo ranks, count the bytes of parameters, gradients and
optimizer state every rank holds afterwards, and print them beside

- the paper's formula with the exact Ψ/N_d (`model_state_bytes(Ψ, N_d, stage, FP32_ADAM)`),
- what each implementation stores: each flat group padded to a multiple of N_d (`padded=True`,
  summed over groups) for ours; per-parameter dim-0 chunks for FSDP2 (`dim0_shard_numel`),

plus the volume each rank sends per step as a ring moves the recorded collectives, in units of
(N_d−1)/N_d · Ψ·4 bytes (ZeRO's "2Ψ" and "3Ψ" count this way). Adam's 0-dim `step` counters
(4 bytes per optimized tensor) are listed apart.

Usage: python benchmarks/memory_measured.py [--world-sizes 2 4] [--steps 2] [--csv out.csv]
                                           [--save | --record FILE.json]
Deterministic: the byte counts do not depend on the machine's speed. ``--save`` records, per
world size and method, the largest gap on any rank between the measured bytes and each
prediction in benchmarks/results/memory_measured.json (`saved`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from toolkit.experiments.memory import METHODS, predicted_rows, run_methods

sys.path.insert(0, str(Path(__file__).resolve().parent))
import saved  # noqa: E402  (benchmarks/saved.py)

ABOUT = ("Per world size and method: Ψ, the largest bytes of model states on a rank, and the "
         "largest |measured − predicted| bytes over the ranks against the implementation's "
         "padded prediction and against the paper's exact 16Ψ/N_d split; ring volume per step "
         "in units of (N−1)/N·Ψ·4 bytes. benchmarks/memory_measured.py --save.")


def table(world_sizes: list[int], steps: int) -> pd.DataFrame:
    frames = [predicted_rows(run_methods(n, METHODS, steps=steps)) for n in world_sizes]
    return pd.concat(frames, ignore_index=True)


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (world size, method): the largest rank's bytes, measured vs predicted."""
    rows = []
    for (n, method), g in df.groupby(["world_size", "method"], sort=False):
        big = g.loc[g.measured_total.idxmax()]
        psi_bytes = 4 * big.psi
        rows.append({
            "N_d": n, "method": method, "stage": big.stage,
            "params": big.params, "grads": big.grads, "optimizer": big.optimizer,
            "measured": big.measured_total, "impl. pred.": big.padded_total,
            "exact pred.": big.pred_total,
            "meas.-impl.": big.measured_total - big.padded_total,
            "meas.-exact": big.measured_total - big.pred_total,
            "ranks differ": int(g.measured_total.nunique() > 1),
            "step ctrs": big.step_bytes,
            "volume/step (Ψ)": round(g.wire_bytes.max() / ((n - 1) / n * psi_bytes), 3),
            "calls/step": big.calls,
        })
    return pd.DataFrame(rows)


def gaps(df: pd.DataFrame) -> dict[str, dict]:
    """{method: figures} of one world size's rows: the largest gap on any rank, in bytes."""
    out = {}
    for method, g in df.groupby("method", sort=False):
        n = int(g.world_size.iloc[0])
        out[method] = {
            "stage": int(g.stage.iloc[0]), "largest_rank_bytes": int(g.measured_total.max()),
            "max_gap_padded_bytes": int((g.measured_total - g.padded_total).abs().max()),
            "max_gap_exact_bytes": int((g.measured_total - g.pred_total).abs().max()),
            "volume_per_step_psi": round(float(g.wire_bytes.max())
                                         / ((n - 1) / n * 4 * float(g.psi.iloc[0])), 3)}
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--csv", help="write every rank's row here")
    saved.add_arguments(parser, "memory_measured")
    args = parser.parse_args(argv)
    if min(args.world_sizes) < 2 or args.steps < 1:
        parser.error("--world-sizes must be >= 2 (sharding needs 2 ranks), --steps >= 1")
    save_to = saved.target(parser, args, "memory_measured")
    load_before = saved.load_average()
    df = table(args.world_sizes, args.steps)
    for n, rows in df.groupby("world_size"):
        saved.record(save_to, "memory_measured", f"{n} ranks",
                     {"world_size": int(n), "psi": int(rows.psi.iloc[0]), "steps": args.steps,
                      "methods": gaps(rows)}, about=ABOUT, load_before=load_before, argv=argv)
    psi = int(df.psi.iloc[0])
    print(f"TinyGPT, Ψ = {psi:,} parameters, fp32 Adam (4 + 4 + 8 = 16 bytes per parameter); "
          f"bytes per rank (the largest rank where they differ)\n")
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(summary(df).to_string(index=False))
    print("\nimpl. pred.: each flat group padded to N_d·⌈n/N_d⌉ elements (ZeRO-1/2: one group; "
          "FSDP: one per unit); torch FSDP2: every parameter split along dim 0, params and grads "
          "padded to ⌈d0/N_d⌉ rows, Adam state not (so its ranks differ).\n"
          "volume/step: ring bytes one rank sends per step for its recorded "
          "collectives ÷ ((N−1)/N · Ψ·4): 2 for DDP, ZeRO-1 and ZeRO-2 (reduce-scatter + "
          "all-gather), 3 for FSDP (a little less: its root is gathered once).")
    if args.csv:
        df.to_csv(args.csv, index=False)
        print(f"\nwrote {args.csv}")


if __name__ == "__main__":
    main()
