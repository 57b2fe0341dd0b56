"""Write the measured figures of docs/figures.md and docs/grading.md from the saved measurements.

Every benchmark behind a figure saves what it measured, with the machine it ran on, in
benchmarks/results/NAME.json (``python benchmarks/NAME.py --save``: `saved`). This script
rewrites, between ``<!-- measured: NAME -->`` and ``<!-- /measured: NAME -->`` markers:

* docs/figures.md: ``machine``, a paragraph on where, when and how busy; ``table``, one row per
  figure: what, one sentence formatted from the file (`figure_sentences`, `grading_figures`)
  with the date, cores and load it was taken at (†: busier than its cores), and the script
  with the command;
* docs/cluster.md: ``wheelhouse`` (benchmarks/wheelhouse.py), ``gpu-check`` (how long
  benchmarks/gpu_check.py took, step by step) and ``cluster-paths`` (the SLURM and torchrun
  tests' table, benchmarks/cluster_paths.py), from `cluster_figures`;
* docs/grading.md: ``rank-start``, ``courier`` (the "reference solutions need" column of the
  caps table, and the grader's peak RSS), ``attacks``, ``judges`` (the measured columns of the
  attacks table), ``timeout`` (the provocations' table) and ``class``: the same sentences where
  the text argues from them, and the tables' measured columns (`grading_figures`).

Nothing else in the pages is touched. tests/test_figures_page.py fails when a page and the
files disagree. After measuring (`make bench` runs every benchmark with --save, then this):

    python benchmarks/figures_page.py           # --check: exit 1 if a page is not up to date
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cluster_figures as cluster  # noqa: E402  (benchmarks/cluster_figures.py)
import figure_sentences as say  # noqa: E402  (benchmarks/figure_sentences.py)
import grading_figures as grader  # noqa: E402  (benchmarks/grading_figures.py)
import saved  # noqa: E402  (benchmarks/saved.py)

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "docs" / "figures.md"
GRADING = ROOT / "docs" / "grading.md"
CLUSTER = ROOT / "docs" / "cluster.md"
Entries = say.Entries
Results = dict[str, Entries]
"""{benchmark name: its saved entries}."""


def everything(entries: Entries) -> Entries:
    return entries


def only(*keys: str) -> Callable[[Entries], Entries]:
    return lambda entries: {k: v for k, v in entries.items() if k in keys}


def labs(entries: Entries) -> Entries:
    return {k: v for k, v in entries.items() if k[:2].isdigit()}


def not_labs(entries: Entries) -> Entries:
    return {k: v for k, v in entries.items() if not k[:2].isdigit() and k != "class"}


def faults(*names: str) -> Callable[[Entries], Entries]:
    """The entries of these faults of the corpus ('fault LAB/NAME'), whatever their lab."""
    return lambda entries: {k: v for k, v in entries.items()
                            if k.startswith("fault ") and k.rpartition("/")[2] in names}


def one_rank_start(entries: Entries) -> Entries:
    """The root run where there is one (the one-fork path a grade takes as root)."""
    key = "as root" if "as root" in entries else next(iter(sorted(entries)), None)
    return {key: entries[key]} if key else {}


@dataclass(frozen=True)
class Row:
    """One figure: what it is, the benchmark that measures it, the entries it reads."""

    what: str
    bench: str
    pick: Callable[[Entries], Entries]
    say: Callable[[Entries], str | None]
    subcommand: str = ""
    """The script's subcommand that measures, where it has them (``--save`` goes after it)."""


ROWS = (
    Row("Starting ranks and one all-reduce", "launch_overhead", everything, say.launch),
    Row("The recorder's cost per call", "launch_overhead", everything, say.recorder),
    Row("The course's sliced ring all-reduce against torch's gloo `all_reduce`", "collectives",
        only("all_reduce"), say.collective_ratio),
    Row("The α-β model against those runs", "collectives", only("all_reduce"),
        say.collective_fit),
    Row("From-scratch DDP against torch's DDP", "ddp_step", everything, say.ddp),
    Row("From-scratch FSDP against torch's FSDP2", "fsdp_step", everything, say.fsdp),
    Row("ZeRO-1/2, FSDP and FSDP2 memory per rank", "memory_measured", everything, say.memory),
    Row("GPipe and 1F1B bubbles on real ranks", "pipeline_bubbles", only("classic"),
        say.bubbles),
    Row("ZB-H1 against 1F1B on real ranks", "pipeline_bubbles", only("zb"), say.zero_bubble),
    Row("Grading one submission", "grading", labs, grader.grade_times),
    Row("Grading a class", "grading", only("class"), grader.grade_class),
    Row("Starting one rank of a grade", "rank_start", one_rank_start, grader.rank_start),
    Row("The grader's memory", "grader_footprint", labs, grader.footprint),
    Row("The grader's memory and judges under attack", "grader_footprint", not_labs,
        grader.attacks),
    Row("A grade's budget, judging included", "grade_timeout", everything, grader.grade_budget),
)
MEMORY_ATTACKS = Row("The red team's attacks on the grader's memory", "grader_footprint",
                     faults("output_hoard", "mark_flood", "stack_flood"), grader.attacks)
ROW = {row.say.__name__: row for row in ROWS}
LESSONS_ROW = ("| Each lesson, top to bottom | Run time and peak memory per lesson, and the "
               "machine they were taken on: the [lesson map](../lessons/README.md), written "
               "from the saved measurements. | `benchmarks/lesson_resources.py --save`, then "
               "`benchmarks/lesson_map.py` |")


CLUSTER_BENCHES = ("wheelhouse", "gpu_check", "cluster_paths")


def load(folder: Path = saved.RESULTS) -> Results:
    """Every benchmark's saved entries in `folder` ({} for one never saved)."""
    return {name: saved.entries(name, folder)
            for name in {row.bench for row in ROWS} | set(CLUSTER_BENCHES)}


def measured_by(bench: str, picked: Entries, *, subcommand: str = "") -> str:
    """The script, linked, and the command lines that took `picked` (``--save`` first, or
    after the `subcommand` those lines start with)."""
    script = f"benchmarks/{bench}.py"
    options = sorted({e["command"].removeprefix(f"python {script}").strip()
                      for e in picked.values()})
    line = (lambda o: f"{o} --save") if subcommand else (lambda o: f"--save {o}")
    # Linked where the script is here (the student edition leaves the grader's benchmarks out).
    name = f"[`{script}`](../{script})" if (ROOT / script).is_file() else f"`{script}`"
    return f"{name} " + "; ".join(f"`{line(o).strip()}`" for o in options)


def sentence(row: Row, results: Results) -> tuple[str, Entries]:
    """The row's sentence with its machine tag, and the entries it read."""
    picked = row.pick(results.get(row.bench, {}))
    text = row.say(picked) if picked else None
    if text is None:
        return (f"Not measured yet: `python benchmarks/{row.bench}.py "
                f"{row.subcommand + ' ' if row.subcommand else ''}--save`."), {}
    return f"{text.removesuffix('.')} ({say.tag(list(picked.values()))}).", picked


def table(results: Results) -> str:
    lines = ["| what | figure | measured by |", "|---|---|---|"]
    for row in ROWS:
        text, picked = sentence(row, results)
        by = measured_by(row.bench, picked) if picked else f"[`benchmarks/{row.bench}.py`]" \
            f"(../benchmarks/{row.bench}.py)"
        lines.append(f"| {row.what} | {text} | {by} |")
    return "\n".join(lines + [LESSONS_ROW])


def machine(results: Results) -> str:
    """Where, when and how busy, computed from every saved entry."""
    entries = [e for bench in sorted({row.bench for row in ROWS})
               for e in results.get(bench, {}).values()]
    if not entries:
        return "Nothing has been measured yet: `make bench` measures every figure."
    machines = [e["machine"] for e in entries]
    commits = sorted({m["commit"] for m in machines})
    dates = sorted({m["date"] for m in machines})
    cpus = sorted({m["cpus"] for m in machines})
    loads = [m[k] for m in machines for k in ("load_before", "load_after")]
    n_busy = sum(say.busy(e) for e in entries)
    text = (f"The figures below were taken on {' or '.join(map(str, cpus))} CPU cores, "
            f"{dates[0] if len(dates) == 1 else f'{dates[0]} to {dates[-1]}'}, by the code of "
            f"commit{'s' if len(commits) > 1 else ''} {', '.join(commits)}"
            + (" (+changes: with changes not yet committed)"
               if any(c.endswith("+changes") for c in commits) else "")
            + f", the 1-minute load average between {min(loads):.1f} and {max(loads):.1f} "
            "around the runs.")
    if n_busy:
        text += (f" {say.BUSY} {n_busy} of the {len(entries)} measured parts ran while other "
                 "work kept the machine busy (its load average above its cores): their times "
                 "are longer than an idle machine's, their ratios and byte counts hold better.")
    return text


def in_grading(row: Row, results: Results) -> str:
    """The row's sentence for a page that argues from it: the script inside the parenthesis."""
    text, picked = sentence(row, results)
    return text if not picked else \
        f"{text.removesuffix(').')}; {measured_by(row.bench, picked, subcommand=row.subcommand)})."


def taken(bench: str, picked: Entries) -> str:
    """The line under a table: when, where, how busy, and the command."""
    if not picked:
        return f"Not measured yet: `python benchmarks/{bench}.py --save`."
    return f"Measured {say.tag(list(picked.values()))}: {measured_by(bench, picked)}."


def courier(old: str, results: Results) -> str:
    """The caps table (needs from each lab's reference), then the grader's own memory."""
    need = grader.courier(old, labs(results.get("grader_footprint", {})))
    return need + "\n\n" + in_grading(ROW["footprint"], results)


def judges(old: str, results: Results) -> str:
    picked = not_labs(results.get("grader_footprint", {}))
    text = grader.judges(old, picked)
    shown = {k: e for k, e in picked.items() if f"`{k.rpartition('/')[2]}`" in text}
    return text + "\n\n" + taken("grader_footprint", shown)


def table_region(bench: str, write: Callable[[Entries], str | None]
                 ) -> Callable[[str, Results], str]:
    """A region that is a whole table (`write`'s, None when nothing is saved), then `taken`."""
    def region(old: str, results: Results) -> str:
        picked = results.get(bench, {})
        text = write(picked) if picked else None
        return taken(bench, picked) if text is None else text + "\n\n" + taken(bench, picked)
    return region


GRADING_REGIONS: dict[str, Callable[[str, Results], str]] = {
    "rank-start": lambda old, r: in_grading(ROW["rank_start"], r),
    "courier": courier,
    "attacks": lambda old, r: in_grading(MEMORY_ATTACKS, r),
    "judges": judges,
    "timeout": table_region("grade_timeout", grader.timeout),
    "class": lambda old, r: in_grading(ROW["grade_class"], r),
}
FIGURES_REGIONS: dict[str, Callable[[str, Results], str]] = {
    "machine": lambda old, r: machine(r),
    "table": lambda old, r: table(r),
}


def render(text: str, regions: dict[str, Callable[[str, Results], str]],
           results: Results) -> str:
    """`text` with each region's content rewritten from `results` (the markers kept). A region
    whose two markers are both absent is skipped (`absent`: the student edition leaves the
    instructors' sections out); one marker without the other is refused."""
    for name, write in regions.items():
        begin, end = f"<!-- measured: {name} -->", f"<!-- /measured: {name} -->"
        if name in absent(text, {name: write}):
            continue
        if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
            raise ValueError(f"expected one {begin} ... {end} region")
        head, rest = text.split(begin, 1)
        old, tail = rest.split(end, 1)
        text = f"{head}{begin}\n{write(old, results).strip()}\n{end}{tail}"
    return text


CLUSTER_REGIONS: dict[str, Callable[[str, Results], str]] = {
    "wheelhouse": lambda old, r: in_grading(
        Row("", "wheelhouse", everything, cluster.wheelhouse, subcommand="download"), r),
    "gpu-check": lambda old, r: in_grading(Row("", "gpu_check", everything, cluster.gpu_check), r),
    "cluster-paths": table_region("cluster_paths", cluster.cluster_paths),
}
def absent(text: str, regions: dict[str, Callable[[str, Results], str]]) -> list[str]:
    """The regions of which `text` holds neither marker."""
    return [name for name in regions if f"<!-- measured: {name} -->" not in text
            and f"<!-- /measured: {name} -->" not in text]


PAGES = ((FIGURES, FIGURES_REGIONS), (GRADING, GRADING_REGIONS), (CLUSTER, CLUSTER_REGIONS))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a page is not up to date")
    args = ap.parse_args(argv)
    results = load()
    stale = []
    for page, regions in PAGES:
        text = page.read_text()
        for name in absent(text, regions):
            print(f"note: {page.relative_to(ROOT)} has no '{name}' region (not in this "
                  "edition): not written")
        new = render(text, regions, results)
        if new != text:
            stale.append(page.relative_to(ROOT))
            if not args.check:
                page.write_text(new)
    if args.check and stale:
        print(f"{', '.join(map(str, stale))} not up to date with benchmarks/results/: "
              "run python benchmarks/figures_page.py")
        return 1
    print("up to date" if not stale else f"wrote {', '.join(map(str, stale))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
