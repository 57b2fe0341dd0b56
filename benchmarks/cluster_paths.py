"""How long the cluster paths of docs/cluster.md take: the SLURM tests (a one-node cluster on
this host: batch grading split across array tasks, the docs' torchrun script, two "nodes"
through srun) and the two-"node" torchrun test without SLURM, run RUNS times.

    python benchmarks/cluster_paths.py [--runs 3] [--save | --record FILE.json]

Each run is one pytest process over tests/test_slurm.py and tests/test_torchrun.py (serial,
``-p no:xdist``) with `pytest_phases` recording every test's setup, call and teardown; the
cluster's start is the setup of the first SLURM test (the module fixture), its stop the
teardown of the last. Prints each test's median and range in seconds; ``--save`` records them
(docs/cluster.md's table is written from the file by benchmarks/figures_page.py). Needs root
and SLURM (`make slurm`), as the tests do: without them it says why and saves nothing (exit 2).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests"))
import saved  # noqa: E402  (benchmarks/saved.py)
import slurm_cluster  # noqa: E402  (tests/slurm_cluster.py)

TESTS = ("tests/test_slurm.py", "tests/test_torchrun.py")
PARTS = {
    "cluster start": ("test_batch_grading_is_split_across_array_tasks_into_one_summary", "setup"),
    "cluster stop": ("test_two_nodes_through_srun_rendezvous_like_one_launch", "teardown"),
    "batch grading": ("test_batch_grading_is_split_across_array_tasks_into_one_summary", "call"),
    "torchrun script": ("test_the_docs_torchrun_script_runs_a_worker_on_two_processes", "call"),
    "two nodes through srun": ("test_two_nodes_through_srun_rendezvous_like_one_launch", "call"),
    "two nodes without SLURM": ("test_two_node_rendezvous_on_one_host_equals_one_launch", "call"),
}
"""What docs/cluster.md's table shows → (the test, the phase that measures it)."""
ABOUT = ("Seconds each cluster path of docs/cluster.md took in the tests (tests/test_slurm.py on a "
         "one-node SLURM cluster on this host, tests/test_torchrun.py), per run: "
         "benchmarks/cluster_paths.py --save.")


def one_run(timeout: float) -> dict[str, float]:
    """One pytest run of TESTS: {part: seconds}; a test that did not pass is an error."""
    with tempfile.TemporaryDirectory() as tmp:
        phases = Path(tmp) / "phases.jsonl"
        env = {**os.environ, "PYTEST_PHASES": str(phases),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE),
                                                           os.environ.get("PYTHONPATH")]))}
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "pytest_phases",
               "-o", "addopts=", "--timeout", "300", *TESTS]
        done = subprocess.run(cmd, cwd=ROOT, env=env, timeout=timeout, text=True,
                              capture_output=True)
        print("    " + (done.stdout.strip().splitlines() or [""])[-1], flush=True)
        rows = [json.loads(line) for line in phases.read_text().splitlines()] \
            if phases.exists() else []
    if done.returncode != 0:
        raise RuntimeError(f"pytest exited {done.returncode}:\n{done.stdout[-3000:]}")
    seconds = {(r["test"].rpartition("::")[2], r["when"]): r["seconds"] for r in rows}
    return {part: seconds[key] for part, key in PARTS.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--runs", type=int, default=3, help="pytest runs (default 3)")
    ap.add_argument("--timeout", type=float, default=900.0,
                    help="seconds one run may take before it counts as failed (default 900)")
    saved.add_arguments(ap, "cluster_paths")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error(f"--runs {args.runs}: expected at least 1")
    save_to = saved.target(ap, args, "cluster_paths")
    if why := slurm_cluster.missing():
        print(f"cluster_paths: {why}; nothing measured", file=sys.stderr)
        return 2
    load_before = saved.load_average()
    runs = []
    for i in range(args.runs):
        print(f"run {i + 1}/{args.runs}", flush=True)
        runs.append(one_run(args.timeout))
    print(f"{'path':<26} {'median s':>9}  range")
    for part in PARTS:
        values = [r[part] for r in runs]
        print(f"{part:<26} {statistics.median(values):9.2f}  {min(values):.2f}-{max(values):.2f}")
    saved.record(save_to, "cluster_paths", "tests", {"runs": runs}, about=ABOUT,
                 load_before=load_before, argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
