"""Time collectives in the manner of nccl-tests: built-in and the toolkit's, CPU or GPU.

    python benchmarks/collectives.py                        # all-reduce, 4 KB..64 MB, 2 and 4 ranks
    python benchmarks/collectives.py --sizes 1M,16M,64M --runs 3          # the ratio, three times
    python benchmarks/collectives.py --collectives reduce_scatter,all_gather,broadcast
    python benchmarks/collectives.py --sizes 16M,64M --slices 64K,256K,1M,4M,16M  # slice sweep
    python benchmarks/collectives.py --backend nccl --out results/h100    # on a GPU node

Method (`toolkit.experiments.collectives.measure`): one launch per world size; warm-up; the
algorithms of a collective alternate trial by trial (rotated order every round) on shared
buffers; a trial is k back-to-back calls after a barrier, its time the slowest rank's; at least
--repeats rounds, more (up to --max-repeats) until each median ratio to torch's built-in is
known to ±--tolerance at 95 % confidence. On a shared machine run it as root with `nice -n -20`.

Prints, per collective and world size: the median time per call with its interquartile range
and the bus bandwidth of each algorithm; the toolkit/built-in ratio (median of the paired
per-trial ratios, interquartile range, 95 % interval of the median, trials); the plain α-β fit
and the piecewise one (`toolkit.cost.piecewise`) with the error at every size. With --runs N
the whole measurement runs N times in a row and a table sets the N ratios side by side and says
whether they agree within their stated spread (each median inside every run's interquartile
range). With --out: results.csv (all runs, column run_index), meta.json, report.html. With
--save (`saved`): per collective, each run's median ratios and the piecewise fits' errors (on
the first run and on the others) in benchmarks/results/collectives.json, where docs/figures.md
reads them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd  # noqa: E402

from toolkit import cost  # noqa: E402
from toolkit.cost.piecewise import as_model, errors_at, fit_piecewise  # noqa: E402
from toolkit.cost.models import algorithms, split_label  # noqa: E402
from toolkit.cost.results import machine_meta, save_results  # noqa: E402
from toolkit.cost.spread import Spread, agree  # noqa: E402
from toolkit.experiments.collectives import measure  # noqa: E402
from toolkit.launch import resolve_placement, visible_gpus  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import saved  # noqa: E402  (benchmarks/saved.py)

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
# Coefficients a(p), b(p) used to fit torch's built-in: gloo's all-reduce is a segmented ring
# (gloo/allreduce.cc), its broadcast a binomial tree (gloo/broadcast.cc); the others are fitted
# with the ring's or the linear algorithm's.
BUILTIN_AS = {"all_reduce": "ring", "reduce_scatter": "ring", "all_gather": "ring",
              "broadcast": "tree", "reduce": "tree", "scatter": "linear", "gather": "linear"}
AIM_RATIO, AIM_MAX, AIM_MEDIAN = 1.05, 0.20, 0.10  # issue 20's aims
ABOUT = ("Per collective: the toolkit / built-in time ratio (median of paired trials, "
         "interquartile range) of each run at each world size and size; the piecewise α-β fit "
         "of each algorithm to the first run (regimes, relative errors at every size) and its "
         "errors on the other runs. benchmarks/collectives.py --save.")


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


def load() -> str:
    """The machine's load: what else ran while we measured."""
    try:
        cpu = Path("/proc/pressure/cpu").read_text().split()[1]  # some avg10=...
    except OSError:
        cpu = "cpu pressure n/a"
    return f"load {os.getloadavg()[0]:.2f}, {cpu}, nice {os.nice(0)}"


def _ms(s: float) -> str:
    return f"{s * 1e3:.3g}"


def short(label: str) -> str:
    """``sliced_ring:slice_bytes=262144`` → ``sliced_ring 256 KB`` (column headers)."""
    name, options = split_label(label)
    shown = [cost.human_bytes(v) if k.endswith("bytes") else f"{k}={v}" for k, v in options.items()]
    return " ".join([name] + shown)


def print_tables(df) -> None:
    for (collective, p), block in df.groupby(["collective", "p"], sort=False):
        algs = list(dict.fromkeys(block.algorithm))
        print(f"\n# {collective}, {p} ranks, {block.backend.iloc[0]}, {block.dtype.iloc[0]}: "
              "median ms per call [interquartile range], bus bandwidth GB/s")
        print(f"{'size':>8}  " + "  ".join(f"{short(a)[:34]:>34}" for a in algs))
        for nbytes, row in block.groupby("nbytes", sort=True):
            cells = []
            for a in algs:
                r = row[row.algorithm == a].iloc[0]
                cells.append(f"{_ms(r.seconds):>7} [{_ms(r.q25_seconds)}-{_ms(r.q75_seconds)}]"
                             f" {r.busbw / 1e9:5.2f}".rjust(34))
            print(f"{cost.human_bytes(nbytes):>8}  " + "  ".join(cells))


def print_ratios(df) -> None:
    mine = df[df.baseline == cost.TORCH]
    if mine.empty:
        return
    print("\n# toolkit / built-in time, paired trial by trial: median [interquartile range] "
          "(95 % interval of the median) trials   (< 1: the toolkit is faster)")
    for (collective, alg, p), block in mine.groupby(["collective", "algorithm", "p"], sort=False):
        print(f"{collective} {alg}, p={p}:")
        for r in block.sort_values("nbytes").itertuples():
            print(f"  {cost.human_bytes(r.nbytes):>8}: {r.ratio:5.2f} [{r.ratio_q25:.2f}-"
                  f"{r.ratio_q75:.2f}] ({r.ratio_lo:.2f}-{r.ratio_hi:.2f}) {r.trials}")


def print_runs(runs: list) -> bool:
    """The issue's table: each run's median ratio, spreads, and whether the runs agree."""
    both = pd.concat(runs, ignore_index=True)
    mine = both[both.baseline == cost.TORCH]
    if mine.empty or len(runs) < 2:
        return True
    ok = True
    print(f"\n# {len(runs)} runs: ratio median [interquartile range] per run; 'agree' = every "
          f"median inside every run's range; aim: median <= {AIM_RATIO}")
    for (collective, alg), block in mine.groupby(["collective", "algorithm"], sort=False):
        print(f"{collective} {alg} / torch")
        for (p, nbytes), cell in block.groupby(["p", "nbytes"]):
            spreads = [Spread(r.ratio, r.ratio_q25, r.ratio_q75, r.ratio_lo, r.ratio_hi, r.trials)
                       for r in cell.itertuples()]
            same = agree(spreads)
            ok &= same
            meds = " / ".join(f"{s.median:.2f} [{s.q25:.2f}-{s.q75:.2f}]" for s in spreads)
            aim = "meets aim" if max(s.median for s in spreads) <= AIM_RATIO else "above aim"
            print(f"  p={p} {cost.human_bytes(nbytes):>6}: {meds}  "
                  f"{'agree' if same else 'DISAGREE'}, {aim}")
    return ok


def print_fits(df, runs: list | None = None, fit_on: str = "seconds") -> tuple[dict, dict]:
    """Plain and piecewise α-β fits per (collective, algorithm, p), error at every size, fitted
    to the column `fit_on` (the median trial, or ``min_seconds``: the fastest, least disturbed).
    Returns (the piecewise fits, each fit's errors on the other `runs`), keyed alike."""
    print(f"\n# α-β fits per (collective, algorithm, p) to {fit_on}: error (model − measured)/"
          f"measured at every size; aim: every size within {AIM_MAX:.0%}, median within "
          f"{AIM_MEDIAN:.0%}")
    df = df.assign(seconds=df[fit_on])
    runs = [r.assign(seconds=r[fit_on]) for r in runs] if runs else runs
    fits, drift = {}, {}
    for (collective, alg, p), block in df.groupby(["collective", "algorithm", "p"], sort=False):
        if block.nbytes.nunique() < 3:
            continue
        as_alg = BUILTIN_AS[collective] if alg == cost.TORCH else alg.partition(":")[0]
        samples = sorted(as_model(block, alg, as_alg), key=lambda s: s.nbytes)
        plain = cost.fit_alpha_beta(samples)
        piece = fit_piecewise(samples)
        fits[(collective, alg, p)] = piece
        met = piece.max_abs_error <= AIM_MAX and piece.median_abs_error <= AIM_MEDIAN
        print(f"{collective} {alg} (as {as_alg}), p={p}:")
        print(f"  one line : {plain.link}; max {plain.max_abs_error:.0%}, "
              f"median {plain.median_abs_error:.0%}")
        for k, reg in enumerate(piece.model.regimes):
            hi = "" if reg.hi == float("inf") else cost.human_bytes(round(reg.hi))
            print(f"  regime {k + 1} : {cost.human_bytes(round(reg.lo))}-{hi or '...'}: {reg.link}")
        print(f"  piecewise: max {piece.max_abs_error:.0%}, median {piece.median_abs_error:.0%} "
              f"({'meets aim' if met else 'misses aim'})")
        print("  size     : " + " ".join(f"{cost.human_bytes(n):>7}" for n in piece.nbytes))
        print("  one line : " + " ".join(f"{e:>+7.0%}" for e in plain.relative_errors))
        print("  piecewise: " + " ".join(f"{e:>+7.0%}" for e in piece.relative_errors))
        for i, other in enumerate(runs[1:] if runs else [], start=2):
            rows = other[(other.collective == collective) & (other.algorithm == alg)
                         & (other.p == p)]
            errs = errors_at(piece, sorted(as_model(rows, alg, as_alg), key=lambda s: s.nbytes))
            drift.setdefault((collective, alg, p), []).append([float(e) for e in errs])
            print(f"  on run {i} : " + " ".join(f"{e:>+7.0%}" for e in errs))
    return fits, drift


def saved_figures(runs: list, fits: dict, drift: dict, agreed: bool) -> dict[str, dict]:
    """{collective: figures} for `saved`: sizes, world sizes, each run's ratios per algorithm,
    p and size ([median, q25, q75]), whether the runs agree, and each fit's errors."""
    both = pd.concat(runs, ignore_index=True)
    out: dict[str, dict] = {}
    for collective, block in both.groupby("collective", sort=False):
        ratios: dict[str, dict[str, dict[str, list]]] = {}
        for r in block[block.baseline == cost.TORCH].sort_values("nbytes").itertuples():
            ratios.setdefault(r.algorithm, {}).setdefault(str(r.p), {}).setdefault(
                str(r.nbytes), []).append([round(r.ratio, 4), round(r.ratio_q25, 4),
                                            round(r.ratio_q75, 4)])
        out[collective] = {
            "backend": str(block.backend.iloc[0]), "runs": len(runs), "runs_agree": agreed,
            "sizes": sorted(int(n) for n in block.nbytes.unique()),
            "world_sizes": sorted(int(p) for p in block.p.unique()),
            "ratios": ratios,
            "fits": {f"{alg} p={p}": {
                "algorithm": alg, "p": p, "regimes": len(fit.model.regimes),
                "nbytes": [int(n) for n in fit.nbytes],
                "errors": [round(float(e), 4) for e in fit.relative_errors],
                "errors_on_other_runs": [[round(e, 4) for e in errs]
                                         for errs in drift.get((c, alg, p), [])]}
                for (c, alg, p), fit in fits.items() if c == collective}}
    return out


def report_html(df, fits, path: Path, meta: dict) -> None:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    groups = list(df.groupby(["collective", "p"], sort=False))
    titles = [t for (c, p), _ in groups
              for t in (f"{c}, p={p}: time per call", f"{c}, p={p}: bus bandwidth")]
    fig = make_subplots(rows=len(groups), cols=2, subplot_titles=titles)
    for i, ((collective, p), block) in enumerate(groups, start=1):
        for alg, rows in block.groupby("algorithm", sort=False):
            rows = rows.sort_values("nbytes")
            err = dict(type="data", symmetric=False, array=(rows.q75_seconds - rows.seconds) * 1e6,
                       arrayminus=(rows.seconds - rows.q25_seconds) * 1e6)
            fig.add_trace(go.Scatter(x=rows.nbytes, y=rows.seconds * 1e6, error_y=err,
                                     mode="lines+markers", name=alg, legendgroup=alg,
                                     showlegend=i == 1), row=i, col=1)
            fig.add_trace(go.Scatter(x=rows.nbytes, y=rows.busbw / 1e9, mode="lines+markers",
                                     name=alg, legendgroup=alg, showlegend=False), row=i, col=2)
            fit = fits.get((collective, alg, p))
            if fit is not None:
                fig.add_trace(go.Scatter(x=rows.nbytes, y=fit.model.predict(rows.nbytes) * 1e6,
                                         mode="lines", line=dict(dash="dot"), name=f"{alg} model",
                                         legendgroup=alg, showlegend=False), row=i, col=1)
        fig.update_xaxes(type="log", title_text="bytes", row=i)
        fig.update_yaxes(type="log", title_text="µs", row=i, col=1)
        fig.update_yaxes(title_text="GB/s", row=i, col=2)
    fig.update_layout(height=380 * len(groups), title=f"collectives on {meta['host']} "
                      f"({meta['backend']}, torch {meta['torch']}, {meta['date']}); bars: "
                      "interquartile range; dotted: piecewise α-β model")
    fig.write_html(path, include_plotlyjs="cdn")


def cases_from(args, ap) -> list[tuple[str, str]]:
    cases = []
    for collective in args.collectives.split(","):
        if collective not in cost.COEFFICIENTS:
            ap.error(f"--collectives: unknown {collective!r}; "
                     f"choose from {', '.join(cost.COEFFICIENTS)}")
        known = algorithms(collective) + [cost.TORCH]
        if args.algorithms == "all":
            wanted = known
        elif args.algorithms == "default":   # the fast toolkit algorithm, the simple one, torch
            wanted = [a for a in ("sliced_ring", "ring", "tree") if a in known][:2] + [cost.TORCH]
        else:
            wanted = args.algorithms.split(",")
        cases += [(collective, a) for a in wanted if a.partition(":")[0] in known]
        for size in args.slices or []:
            if "sliced_ring" in known:
                cases.append((collective, f"sliced_ring:slice_bytes={size}"))
    if not cases:
        ap.error(f"--algorithms {args.algorithms!r} matches none of the chosen collectives")
    return list(dict.fromkeys(cases))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--collectives", default="all_reduce",
                    help=f"comma list from {', '.join(cost.COEFFICIENTS)} (default all_reduce)")
    ap.add_argument("--algorithms", default="default",
                    help="comma list (sliced_ring, ring, tree, ps, ..., torch; options after a "
                         "colon: sliced_ring:slice_bytes=65536), 'all', or 'default' (the sliced "
                         "ring or tree, the simple ring, torch)")
    ap.add_argument("--slices", type=lambda t: [parse_size(s) for s in t.split(",")],
                    help="also run the sliced ring with each of these slice sizes (e.g. 64K,1M)")
    ap.add_argument("--sizes", type=parse_sizes, default=parse_sizes("4K:64M:2"),
                    help="bytes: LOW:HIGH[:FACTOR] (×4 steps unless FACTOR) or a comma list "
                         "(default 4K:64M:2, 15 sizes)")
    ap.add_argument("--world-sizes", default="2,4", help="comma list of rank counts (default 2,4)")
    ap.add_argument("--repeats", type=int, default=9,
                    help="alternating rounds at least (default 9)")
    ap.add_argument("--max-repeats", type=int, default=41,
                    help="rounds at most, until the ratio is pinned (default 41)")
    ap.add_argument("--tolerance", type=float, default=0.03,
                    help="stop once each median ratio is known to ± this (95 %%; default 0.03)")
    ap.add_argument("--min-time", type=float, default=0.02,
                    help="seconds one trial should last; small sizes repeat the call "
                         "(default 0.02)")
    ap.add_argument("--fit-on", default="seconds", choices=["seconds", "min_seconds"],
                    help="fit the models to the median trial (default) or the fastest one")
    ap.add_argument("--runs", type=int, default=1,
                    help="measure this many times in a row (default 1)")
    ap.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"],
                    help="auto: NCCL when there are enough GPUs, else gloo")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"],
                    help="cuda: the GPUs there are, shared by the ranks when fewer (gloo); "
                    "default: $TOOLKIT_DEVICE, else auto")
    ap.add_argument("--out", type=Path, help="folder for results.csv, meta.json, report.html")
    saved.add_arguments(ap, "collectives")
    args = ap.parse_args(argv)
    save_to = saved.target(ap, args, "collectives")
    try:
        world_sizes = [int(p) for p in args.world_sizes.split(",")]
    except ValueError:
        ap.error(f"--world-sizes wants integers like 2,4; got {args.world_sizes!r}")
    if args.runs < 1:
        ap.error("--runs must be >= 1")
    cases = cases_from(args, ap)
    print(f"{len(cases)} (collective, algorithm) pairs × {len(args.sizes)} sizes × world sizes "
          f"{world_sizes}; {args.repeats}-{args.max_repeats} alternating rounds; {args.runs} "
          f"run(s); {load()}", flush=True)
    start, runs, load_before = time.perf_counter(), [], saved.load_average()
    for i in range(args.runs):
        try:
            df = measure(cases, sizes=args.sizes, world_sizes=world_sizes,
                         repeats=args.repeats, max_repeats=max(args.repeats, args.max_repeats),
                              tolerance=args.tolerance, min_time=args.min_time,
                              backend=args.backend, device=args.device, progress=True)
        except ValueError as exc:
            ap.error(str(exc))
        runs.append(df.assign(run_index=i + 1))
        print(f"\n## run {i + 1} of {args.runs} ({load()})")
        print_tables(df)
        print_ratios(df)
    agreed = print_runs(runs)
    fits, drift = print_fits(runs[0], runs, args.fit_on)
    print(f"\ntotal {time.perf_counter() - start:.0f} s; {load()}")
    for collective, figures in saved_figures(runs, fits, drift, agreed).items():
        saved.record(save_to, "collectives", collective, figures, about=ABOUT,
                     load_before=load_before, argv=argv)
    if args.out:
        table = pd.concat(runs, ignore_index=True)
        backend = str(table.backend.iloc[0])
        placement = resolve_placement(args.backend, args.device, max(world_sizes))
        on_gpus = placement.kind != "cpu"
        meta = machine_meta(backend, gpus=[g.name for g in visible_gpus()] if on_gpus else None)
        meta["placement"] = placement.kind  # cpu, gpu (one per rank) or shared
        meta["args"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        meta["runs_agree"] = bool(agreed)
        folder = save_results(table, args.out, meta)
        report_html(runs[0], fits, folder / "report.html", meta)
        print(f"saved {folder}/results.csv, meta.json, report.html")
    return 0


if __name__ == "__main__":
    sys.exit(main())
