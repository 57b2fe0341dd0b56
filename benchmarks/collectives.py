"""Time collectives in the manner of nccl-tests: built-in and the toolkit's, CPU or GPU.

    python benchmarks/collectives.py          # all-reduce, 4 KB..64 MB, 2 and 4 ranks
    python benchmarks/collectives.py --collectives all_reduce,broadcast --world-sizes 2,4,8
    python benchmarks/collectives.py --backend nccl --out results/h100   # on a GPU node

Prints, per collective and world size, one nccl-tests-style table (size, count, type, then time,
algbw and busbw for each algorithm), the toolkit/built-in time ratio, and α, β fitted per
algorithm with the model's error at every size. With --out it saves results.csv, meta.json (the
`toolkit.cost.results` format) and a plotly report.html.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from toolkit import cost  # noqa: E402
from toolkit.cost.results import machine_meta, save_results  # noqa: E402
from toolkit.experiments.collectives import measure  # noqa: E402

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("B")
    unit = text[-1] if text and text[-1] in UNITS else ""
    try:
        value = float(text[: len(text) - len(unit)]) * UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use e.g. 4096, 4K, 64M)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"size must be >= 1 byte, got {text!r}")
    return int(value)


def parse_sizes(text: str) -> list[int]:
    """``4K:64M`` (×4 steps), ``4K:64M:2`` (×2 steps), or a list ``4K,1M,64M``."""
    if ":" in text:
        parts = text.split(":")
        lo, hi = parse_size(parts[0]), parse_size(parts[1])
        step = int(parts[2]) if len(parts) > 2 else 4
        if lo > hi or step < 2:
            raise argparse.ArgumentTypeError(f"bad range {text!r}: want LOW:HIGH[:FACTOR>=2]")
        out = [lo]
        while out[-1] * step <= hi:
            out.append(out[-1] * step)
        return out
    return [parse_size(s) for s in text.split(",")]


def print_tables(df) -> None:
    for (collective, p), block in df.groupby(["collective", "p"], sort=False):
        algs = list(dict.fromkeys(block.algorithm))
        print(f"\n# {collective}, {p} ranks, {block.backend.iloc[0]}, {block.dtype.iloc[0]}")
        head = f"{'size':>10} {'count':>10}  " + "  ".join(
            f"{a + ' time(us)':>18} {'algbw':>6} {'busbw':>6}" for a in algs)
        print(head + "   (GB/s)")
        for nbytes, row in block.groupby("nbytes", sort=True):
            cells = []
            for a in algs:
                r = row[row.algorithm == a].iloc[0]
                cells.append(f"{r.seconds * 1e6:>18.1f} {r.algbw / 1e9:>6.2f} "
                             f"{r.busbw / 1e9:>6.2f}")
            print(f"{cost.human_bytes(nbytes):>10} {row.numel.iloc[0]:>10}  " + "  ".join(cells))


def print_ratios(df) -> None:
    base = df[df.algorithm == cost.TORCH]
    if base.empty:
        return
    print("\n# toolkit time / torch built-in time (< 1: the toolkit is faster)")
    for (collective, p), block in df.groupby(["collective", "p"], sort=False):
        ref = base[(base.collective == collective) & (base.p == p)].set_index("nbytes").seconds
        for alg in dict.fromkeys(block.algorithm):
            if alg == cost.TORCH:
                continue
            mine = block[block.algorithm == alg].set_index("nbytes").seconds
            ratios = "  ".join(f"{cost.human_bytes(n)}: {mine[n] / ref[n]:.2f}"
                               for n in mine.index if n in ref)
            print(f"{collective:>15} {alg:>11} p={p}:  {ratios}")


def print_fits(df):
    print("\n# α-β fit per algorithm (relative least squares over every size and world size)")
    fits = {}
    ours = df[df.algorithm != cost.TORCH]
    for (collective, alg), block in ours.groupby(["collective", "algorithm"]):
        if block.nbytes.nunique() < 2:
            continue
        fit = cost.fit_alpha_beta(block)
        fits[(collective, alg)] = fit
        errs = "  ".join(f"{e:+.0%}" for e in fit.relative_errors)
        print(f"{collective:>15} {alg:>11}: {fit.link}; error max {fit.max_abs_error:.0%}, "
              f"median {fit.median_abs_error:.0%}  [{errs}]")
    return fits


def report_html(df, fits, path: Path, meta: dict) -> None:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    groups = list(df.groupby(["collective", "p"], sort=False))
    fig = make_subplots(rows=len(groups), cols=2, subplot_titles=[
        t for (c, p), _ in groups
        for t in (f"{c}, p={p}: time per call", f"{c}, p={p}: bus bandwidth")])
    for i, ((collective, p), block) in enumerate(groups, start=1):
        for alg, rows in block.groupby("algorithm", sort=False):
            rows = rows.sort_values("nbytes")
            fig.add_trace(go.Scatter(x=rows.nbytes, y=rows.seconds * 1e6, mode="lines+markers",
                                     name=f"{alg}", legendgroup=alg, showlegend=i == 1),
                          row=i, col=1)
            fig.add_trace(go.Scatter(x=rows.nbytes, y=rows.busbw / 1e9, mode="lines+markers",
                                     name=alg, legendgroup=alg, showlegend=False), row=i, col=2)
            fit = fits.get((collective, alg))
            if fit is not None:
                pred = cost.predict(collective, alg, rows.nbytes, int(p), fit.link)
                fig.add_trace(go.Scatter(x=rows.nbytes, y=pred * 1e6, mode="lines",
                                         line=dict(dash="dot"), name=f"{alg} model",
                                         legendgroup=alg, showlegend=False), row=i, col=1)
        fig.update_xaxes(type="log", title_text="bytes", row=i)
        fig.update_yaxes(type="log", title_text="µs", row=i, col=1)
        fig.update_yaxes(title_text="GB/s", row=i, col=2)
    fig.update_layout(height=380 * len(groups), title=f"collectives on {meta['host']} "
                      f"({meta['backend']}, torch {meta['torch']}, {meta['date']}); "
                      "dotted: fitted α-β model")
    fig.write_html(path, include_plotlyjs="cdn")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--collectives", default="all_reduce",
                    help=f"comma list from {', '.join(cost.COEFFICIENTS)} (default all_reduce)")
    ap.add_argument("--algorithms", default="all",
                    help="comma list of algorithms (ring, tree, ps, ..., torch) or 'all' (default)")
    ap.add_argument("--sizes", type=parse_sizes, default=parse_sizes("4K:64M"),
                    help="bytes: LOW:HIGH[:FACTOR] or a comma list (default 4K:64M, ×4 steps)")
    ap.add_argument("--world-sizes", default="2,4", help="comma list of rank counts (default 2,4)")
    ap.add_argument("--repeats", type=int, default=5, help="timed trials per point (default 5)")
    ap.add_argument("--min-time", type=float, default=0.01,
                    help="seconds one trial should last; small sizes repeat the call "
                         "(default 0.01)")
    ap.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"],
                    help="auto: NCCL when there are enough GPUs, else gloo")
    ap.add_argument("--out", type=Path, help="folder for results.csv, meta.json, report.html")
    args = ap.parse_args(argv)

    try:
        world_sizes = [int(p) for p in args.world_sizes.split(",")]
    except ValueError:
        ap.error(f"--world-sizes wants integers like 2,4; got {args.world_sizes!r}")
    cases = []
    for collective in args.collectives.split(","):
        if collective not in cost.COEFFICIENTS:
            ap.error(f"--collectives: unknown {collective!r}; "
                     f"choose from {', '.join(cost.COEFFICIENTS)}")
        known = list(cost.COEFFICIENTS[collective]) + [cost.TORCH]
        wanted = known if args.algorithms == "all" else args.algorithms.split(",")
        cases += [(collective, a) for a in wanted if a in known]
    if not cases:
        ap.error(f"--algorithms {args.algorithms!r} matches none of the chosen collectives")

    print(f"{len(cases)} (collective, algorithm) pairs × {len(args.sizes)} sizes × world sizes "
          f"{world_sizes}; {args.repeats} trials each", flush=True)
    start = time.perf_counter()
    try:
        df = measure(cases, sizes=args.sizes, world_sizes=world_sizes, repeats=args.repeats,
                          min_time=args.min_time, backend=args.backend, progress=True)
    except ValueError as exc:
        ap.error(str(exc))
    print_tables(df)
    print_ratios(df)
    fits = print_fits(df)
    print(f"\ntotal {time.perf_counter() - start:.0f} s")
    if args.out:
        meta = machine_meta(str(df.backend.iloc[0]))
        meta["args"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        folder = save_results(df, args.out, meta)
        report_html(df, fits, folder / "report.html", meta)
        print(f"saved {folder}/results.csv, meta.json, report.html")
    return 0


if __name__ == "__main__":
    sys.exit(main())
