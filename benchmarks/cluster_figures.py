"""docs/cluster.md's figures, written from the saved entries (`saved`): the wheelhouse's size
(benchmarks/wheelhouse.py download --save), how long `make gpu-check` took, on a GPU and in its
CPU rehearsal (benchmarks/gpu_check.py --save), and the cluster paths' table
(benchmarks/cluster_paths.py --save). `benchmarks/figures_page.py` calls these; each returns
None when nothing is saved, and the page then says how to measure it.
"""

from __future__ import annotations

import statistics

from figure_sentences import plural, span

Entries = dict[str, dict]
PATHS = (
    ("cluster start (fixture)", "cluster start",
     "munged, slurmctld, slurmd up and the node idle"),
    ("cluster stop (fixture)", "cluster stop", "jobs cancelled, daemons ended"),
    ("batch grading through `--slurm 2`", "batch grading",
     "3 lab-01 submissions, 2 array tasks, one summary.csv"),
    ("the SLURM script above", "torchrun script",
     "sbatch, srun, torchrun, 2 ranks of a toolkit worker"),
    ("two \"nodes\" through srun", "two nodes through srun",
     "2 torchruns with `--nnodes 2` vs one 2-process launch"),
    ("two \"nodes\" without SLURM (`tests/test_torchrun.py`)", "two nodes without SLURM",
     "the same, as two plain processes"),
)
"""docs/cluster.md's rows: (test, the part benchmarks/cluster_paths.py saves, what runs)."""


def wheelhouse(entries: Entries) -> str | None:
    """'53 wheels, 58 MB for Python 3.12 on x86_64' for every saved version and platform."""
    said = [f"{plural(f['wheels'], 'wheel')}, {f['bytes'] / 1e6:.0f} MB for Python "
            f"{f['python']} on {f['platform']}"
            for f in (e["figures"] for _, e in sorted(entries.items()))]
    return f"`make wheelhouse` downloaded {'; '.join(said)}" if said else None


def _steps(fig: dict) -> str:
    return ", ".join(f"{name} {s:.0f} s" + ("" if status == "ok" else f" ({status})")
                     for name, status, s in fig["steps"])


def gpu_check(entries: Entries) -> str | None:
    """How long each saved run took, step by step, a GPU's first; a CPU rehearsal says so."""
    said = []
    for key, entry in sorted(entries.items(), key=lambda kv: kv[0] == "cpu"):
        fig = entry["figures"]
        passed = sum(status == "ok" for _, status, _ in fig["steps"])
        lessons = ", ".join(fig["lessons"])
        where = ("The CPU rehearsal (`--device cpu`" + (", `--quick`" if fig["quick"] else "")
                 + f", lessons {lessons})" if key == "cpu" else
                 f"On {plural(fig['gpus'], 'GPU')} (placement {fig['placement']}, world sizes "
                 f"{', '.join(map(str, fig['worlds']))}, lessons {lessons})")
        said.append(f"{where}: {passed} of {len(fig['steps'])} steps passed in "
                    f"{fig['total_s']:.0f} s of its {fig['budget_s']:.0f} s budget: "
                    f"{_steps(fig)}")
    if not said:
        return None
    if "cpu" in entries and len(entries) == 1:
        said.insert(0, "Not yet run on a GPU (none was lent while this was written); the budget "
                    "bounds it")
    return ". ".join(said)


def cluster_paths(entries: Entries) -> str | None:
    """The table: each path's median and range over the saved runs, in seconds."""
    runs = [run for e in entries.values() for run in e["figures"]["runs"]]
    if not runs:
        return None
    lines = [f"Median of {plural(len(runs), 'run')} and range, in seconds:", "",
             "| test | what runs | seconds |", "|---|---|---|"]
    for test, part, what in PATHS:
        values = [run[part] for run in runs]
        med = statistics.median(values)
        fmt = "{:.2f}" if med < 10 else "{:.0f}"
        spread = span(values, fmt)
        lines.append(f"| {test} | {what} | {fmt.format(med)}"
                     + (f" ({spread})" if "-" in spread else "") + " |")
    return "\n".join(lines)
