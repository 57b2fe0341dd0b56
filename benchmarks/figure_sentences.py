"""One sentence per measured figure, formatted from the saved entries (`saved`), never typed.

Each function takes a benchmark's entries ({key: entry}, from benchmarks/results/NAME.json)
and returns the sentence a reader sees, or None when nothing is saved yet. `tag` says when and
on what machine the figures were taken; † marks a machine busier than its cores (its 1-minute
load average above them just before a part ran): times run longer than on an idle machine,
ratios and byte counts hold better. `benchmarks/figures_page.py` puts the sentences into
docs/figures.md; the grader's are in `grading_figures`, beside docs/grading.md's tables.
"""

from __future__ import annotations

from typing import Any

from toolkit.formats import human_bytes

Entries = dict[str, dict[str, Any]]
BUSY = "†"


def busy(entry: dict) -> bool:
    """Whether other work kept the machine busy: a load average above its cores before a part."""
    return entry["machine"]["load_before"] > entry["machine"]["cpus"]


def tag(entries: list[dict]) -> str:
    """When and where: '2026-11-27, 2 cores, load average 9.1-9.8 †'."""
    machines = [e["machine"] for e in entries]
    dates = sorted({m["date"] for m in machines})
    cpus = sorted({m["cpus"] for m in machines})
    loads = [m[k] for m in machines for k in ("load_before", "load_after")]
    return (f"{dates[0] if len(dates) == 1 else f'{dates[0]} to {dates[-1]}'}, "
            f"{' or '.join(map(str, cpus))} cores, load average {span(loads, '{:.1f}')}"
            + (f" {BUSY}" if any(busy(e) for e in entries) else ""))


def span(values: list[float], fmt: str = "{:.2f}", sep: str = "-") -> str:
    """'lo-hi' of `values` in `fmt`, or one value when they print alike."""
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return lo if lo == hi else f"{lo}{sep}{hi}"


def seconds(s: float) -> str:
    """A duration in the unit that reads best: µs, ms, s (3 significant digits)."""
    if s < 1e-3:
        return f"{s * 1e6:.2g} µs" if s < 1e-6 else f"{s * 1e6:.3g} µs"
    if s < 1:
        return f"{s * 1e3:.3g} ms"
    return f"{s:,.0f} s" if s >= 100 else f"{s:.3g} s"


def _ranks(entries: Entries, field: str = "ranks") -> list[dict]:
    """The entries in increasing world size."""
    return sorted(entries.values(), key=lambda e: e["figures"][field])


def _at_ranks(parts: list[str], ranks: list[int], what: str = "") -> str:
    """'A{what} at 2 ranks and B at 4' from parts per world size."""
    said = [f"{parts[0]}{what} at {ranks[0]} ranks"] + [f"{x} at {p}" for x, p in
                                                         zip(parts[1:], ranks[1:])]
    return said[0] if len(said) == 1 else ", ".join(said[:-1]) + " and " + said[-1]


def plural(n: int, word: str, many: str | None = None) -> str:
    """'1 run', '3 runs'; `many` where the plural is not word + s."""
    return f"{n} {word if n == 1 else many or word + 's'}"


def launch(entries: Entries) -> str | None:
    if not entries:
        return None
    e = _ranks(entries)[-1]
    paths = {r["path"]: r for r in e["figures"]["launch"]}
    fork, nb, sp = (paths["script, fork"], paths["notebook cell, fork (auto)"],
                    paths["script, spawn"])
    return (f"`spawn` of {e['figures']['ranks']} ranks returns in {seconds(fork['median_s'])} "
            f"from a script (median of {plural(fork['launches'], 'launch', 'launches')}) and "
            f"{seconds(nb['median_s'])} from a notebook cell; with `start_method=\"spawn\"` "
            f"(fresh interpreters, as NCCL needs), {seconds(sp['median_s'])} "
            f"(median of {sp['launches']}).")


def recorder(entries: Entries) -> str | None:
    if not entries:
        return None
    e = _ranks(entries)[-1]["figures"]
    alone = e["wrapper_alone_s_per_call"]
    base = alone["no-op itself"]
    cost = {k: max(0.0, v - base) for k, v in alone.items()}
    p = max(e["recorder_s_per_call"], key=int)
    calls = e["recorder_s_per_call"][p]
    return (f"The wrapper adds {seconds(cost['wrapper, idle'])} per call when idle, "
            f"{seconds(cost['wrapper + in-flight board'])} in a rank (the in-flight board) and "
            f"{seconds(cost['wrapper + board + recording'])} while recording (around a no-op); "
            f"a 4-byte all_reduce on {p} gloo ranks takes {seconds(calls['unwrapped'])} "
            f"unwrapped and {seconds(calls['recording'])} recorded.")


def _ratio_ranges(fig: dict, algorithm: str, nbytes: int) -> tuple[list[str], list[int]]:
    by_p = fig["ratios"][algorithm]
    ranks = sorted(int(p) for p in by_p)
    return ([span([run[0] for run in by_p[str(p)][str(nbytes)]]) + "×" for p in ranks], ranks)


def _mine(fig: dict) -> str:
    """The toolkit algorithm the figures are about: the sliced ring where it ran."""
    return "sliced_ring" if "sliced_ring" in fig["ratios"] else sorted(fig["ratios"])[0]


def collective_ratio(entries: Entries) -> str | None:
    if "all_reduce" not in entries:
        return None
    fig = entries["all_reduce"]["figures"]
    alg = _mine(fig)
    big, small = max(fig["sizes"]), min(fig["sizes"])
    at_big, ranks = _ratio_ranges(fig, alg, big)
    at_small, _ = _ratio_ranges(fig, alg, small)
    runs = fig["runs"]
    agree = ("which agree within their interquartile ranges" if fig["runs_agree"]
             else "which do not all agree within their interquartile ranges")
    of_gloo = _at_ranks(at_big, ranks, " the time of gloo's `all_reduce`")
    how = f"medians of paired trials, {plural(runs, 'run')}" + (f", {agree}" if runs > 1 else "")
    return (f"At {human_bytes(big)} the course's {alg.replace('_', ' ')} all-reduce takes "
            f"{of_gloo} ({how}); at {human_bytes(small)}, {_at_ranks(at_small, ranks)}.")


def collective_fit(entries: Entries) -> str | None:
    if "all_reduce" not in entries or not entries["all_reduce"]["figures"]["fits"]:
        return None
    fig = entries["all_reduce"]["figures"]
    alg = _mine(fig)
    fits = sorted((f for f in fig["fits"].values() if f["algorithm"] == alg),
                  key=lambda f: f["p"])
    if not fits:
        return None
    worst = [f"{max(abs(x) for x in f['errors']):.0%}" for f in fits]
    regimes = span([f["regimes"] for f in fits], "{:d}")
    drift = [abs(x) for f in fits for run in f["errors_on_other_runs"] for x in run]
    return (f"Fitted piecewise to the first run ({regimes} size regime"
            f"{'' if regimes == '1' else 's'}), the {alg.replace('_', ' ')}'s α-β model is "
            f"within {_at_ranks(worst, [f['p'] for f in fits], ' of the measured median')} at "
            f"every size from {human_bytes(min(fig['sizes']))} to {human_bytes(max(fig['sizes']))}"
            + (f"; on the other runs the same model is off by up to {max(drift):.0%} "
               "(run-to-run drift)" if drift else "") + ".")


def ddp(entries: Entries) -> str | None:
    if not entries:
        return None
    es = _ranks(entries)
    ranks = [e["figures"]["ranks"] for e in es]
    overlapped = [f"{e['figures']['vs_torch']['overlapped']:.2f}×" for e in es]
    bucketed = [f"{e['figures']['vs_torch']['bucketed']:.2f}×" for e in es]
    naive = [f"{e['figures']['vs_torch']['naive']:.2f}×" for e in es]
    return ("The overlapped DDP's step takes "
            + _at_ranks(overlapped, ranks, " torch DDP's time") + " "
            f"({human_bytes(es[0]['figures']['gradient_bytes'])} of gradients, median of "
            f"{es[0]['figures']['steps']} steps); bucketed after backward "
            f"{_at_ranks(bucketed, ranks)}, one all-reduce per parameter "
            f"{_at_ranks(naive, ranks)}.")


def fsdp(entries: Entries) -> str | None:
    if not entries:
        return None
    es = _ranks(entries)
    ranks = [e["figures"]["ranks"] for e in es]
    ours = [f"{e['figures']['vs_fsdp2']['ours']:.2f}×" for e in es]
    pre = [f"{e['figures']['vs_fsdp2']['ours + prefetch']:.2f}×" for e in es]
    losses = [e["figures"]["loss"] for e in es]
    gap = max(abs(v - loss["torch FSDP2"]) / abs(loss["torch FSDP2"])
              for loss in losses for v in loss.values())
    same = "equals FSDP2's" if gap == 0 else f"is within {gap:.1e} (relative) of FSDP2's"
    return ("The course's FSDP step takes " + _at_ranks(ours, ranks, " FSDP2's time") + ", with "
            f"prefetch {_at_ranks(pre, ranks)} (median of {es[0]['figures']['steps']} steps); "
            f"every variant's loss after the run {same}.")


METHODS = {"ddp": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "fsdp": "FSDP",
           "torch_fsdp2": "torch's FSDP2"}


def memory(entries: Entries) -> str | None:
    if not entries:
        return None
    es = sorted(entries.values(), key=lambda e: e["figures"]["world_size"])
    methods = list(es[0]["figures"]["methods"])
    padded = max(m["max_gap_padded_bytes"] for e in es for m in e["figures"]["methods"].values())
    exact = {name: max(e["figures"]["methods"][name]["max_gap_exact_bytes"] for e in es
                       if name in e["figures"]["methods"]) for name in methods}
    ours = [n for n in methods if n != "torch_fsdp2"]
    return (f"On every rank of {', '.join(METHODS.get(n, n) for n in methods)} at N = "
            f"{', '.join(str(e['figures']['world_size']) for e in es)} (Ψ = "
            f"{es[0]['figures']['psi']:,}, fp32 Adam), the bytes of model states differ from "
            f"`toolkit.memory`'s padded prediction by at most {padded:,} B, and the course's own "
            f"from the paper's exact 16Ψ/N by at most {max(exact[n] for n in ours):,} B"
            + (f" (FSDP2's, whose Adam state is not padded: {exact['torch_fsdp2']:,} B)"
               if "torch_fsdp2" in exact else "") + ".")


def bubbles(entries: Entries) -> str | None:
    if "classic" not in entries:
        return None
    fig = entries["classic"]["figures"]
    rows = fig["rows"]
    worst = max(abs(r["measured"] - r["formula"]) / r["formula"] for r in rows)
    ps = sorted({r["p"] for r in rows})
    ms = sorted({r["m"] for r in rows})
    return (f"The measured bubble of GPipe and 1F1B is within {worst:.1%} of (p−1)/(m+p−1) for "
            f"p = {', '.join(map(str, ps))} and m = {', '.join(map(str, ms))} (median of "
            f"{plural(fig['repeats'], 'run')}, ops sleeping "
            f"{fig['forward_ms']:g} ms per sample and block forward, twice that backward).")


def zero_bubble(entries: Entries) -> str | None:
    if "zb" not in entries:
        return None
    rows = entries["zb"]["figures"]["rows"]
    zb = [r for r in rows if r["schedule"] == "zb-h1"]
    worst = max(abs(r["measured"] - r["formula"]) / r["formula"] for r in zb)
    by = {(r["times"], r["p"], r["m"], r["schedule"]): r for r in rows}
    cut = [1 - by[t, p, m, "zb-h1"]["makespan_ms"] / r["makespan_ms"]
           for (t, p, m, name), r in by.items() if name == "1f1b"]
    return (f"ZB-H1's measured bubble is within {worst:.1%} of Qi et al.'s formula (Table 2) "
            f"and its step {span(cut, '{:.0%}', ' to ')} shorter than 1F1B's on the same ops.")
