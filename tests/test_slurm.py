"""A real SLURM cluster (one node, this host) running the course's cluster paths: batch grading
split across a job array, docs/cluster.md's torchrun + SLURM script, and a two-"node"
rendezvous through srun. Skipped, saying why, without root or without SLURM (`make slurm`).

Every command is bounded by a timeout (the cluster's own waits, sbatch --wait, srun); the
fixture cancels every job and stops the daemons at the end.
"""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path

import pytest
import slurm_cluster
from procs import free_ports
from torchrun_worker import NUMEL, expected_sum, launch_result

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("torchrun_worker.py")
REFERENCE = ROOT / "labs" / "01_collectives" / "collectives.py"
FAULTS = Path(__file__).with_name("faults") / "01_collectives"

# One cluster for the module: on one pytest-xdist worker (conftest.py's ONE_WORKER_FILES), so it
# starts once.
pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.multirank]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = slurm_cluster.missing()
    if why:
        pytest.skip(why)
    c = slurm_cluster.Cluster(tmp_path_factory.mktemp("slurm"))
    try:
        yield c.start(timeout=60)
    finally:
        c.stop(timeout=30)


def test_batch_grading_is_split_across_array_tasks_into_one_summary(cluster, tmp_path):
    subs = tmp_path / "submissions"
    (subs / "alice").mkdir(parents=True)
    (subs / "alice" / "collectives.py").write_text(REFERENCE.read_text())  # full marks
    (subs / "bob.py").write_text(REFERENCE.read_text() + "\n\n"
                                 + (FAULTS / "mistake_averaged.py").read_text())
    (subs / "carol").mkdir()  # handed in nothing
    out = tmp_path / "graded"
    done = cluster.run([sys.executable, "-m", "autograder", "batch", str(subs),
                        "--lab", "01_collectives", "--slurm", "2", "--jobs", "1",
                        "--out", str(out)], timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "submitting 2 array task(s) for 3 submissions" in done.stderr
    with open(out / "summary.csv") as f:
        rows = {r["submission"]: r for r in csv.DictReader(f)}
    assert sorted(rows) == ["alice", "bob", "carol"]
    full = float(rows["alice"]["max_score"])
    assert full > 0 and float(rows["alice"]["score"]) == full
    assert 0 < float(rows["bob"]["score"]) < full and "wrong_result" in rows["bob"]["failures"]
    assert float(rows["carol"]["score"]) == 0 and "missing_file" in rows["carol"]["failures"]
    for name in rows:
        data = json.loads((out / name / "results.json").read_text())
        assert float(data["score"]) == float(rows[name]["score"])
    # Round-robin: task 0 graded alice and carol, task 1 bob, each with the ordinary command.
    logs = {i: (out / "slurm" / f"task-{i}.out").read_text() for i in (0, 1)}
    assert re.search(r"alice: [\d.]+/", logs[0]) and re.search(r"carol: 0/", logs[0])
    assert re.search(r"bob: [\d.]+/", logs[1]) and "alice" not in logs[1]
    assert "--array=0-1" in (out / "slurm" / "grade.sbatch").read_text()


def _docs_template() -> str:
    """The SLURM script of docs/cluster.md, as printed there."""
    text = (ROOT / "docs" / "cluster.md").read_text()
    section = text[text.index("## SLURM"):]
    start = section.index("```bash\n") + len("```bash\n")
    return section[start:section.index("\n```", start)] + "\n"


def test_the_docs_torchrun_script_runs_a_worker_on_two_processes(cluster, tmp_path):
    script = _docs_template()
    assert "srun .venv/bin/torchrun" in script and "--rdzv-backend c10d" in script
    # The test node has no GPUs: drop that request; the rest runs as printed.
    script = "\n".join(ln for ln in script.splitlines() if "--gpus-per-node" not in ln) + "\n"
    (tmp_path / "job.sbatch").write_text(script)
    (tmp_path / "job.py").write_text(WORKER.read_text())
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    done = cluster.run(["sbatch", "--wait", "--parsable", "--nodes=1", f"--chdir={tmp_path}",
                        f"--output={tmp_path}/slurm.out",
                        f"--export=ALL,GPUS_PER_NODE=2,RDZV_PORT={free_ports()[0]}",
                        str(tmp_path / "job.sbatch")], timeout=300)
    log = (tmp_path / "slurm.out").read_text() if (tmp_path / "slurm.out").exists() else ""
    assert done.returncode == 0, done.stdout + done.stderr + log
    ranks = launch_result(tmp_path / "results", 2)
    job = done.stdout.strip().split(";")[0]
    for rank, r in enumerate(ranks):
        where = (r["rank"], r["world_size"], r["backend"], r["local_rank"])
        assert where == (rank, 2, "gloo", rank)
        assert r["sum"] == expected_sum(2) and r["slurm_job"] == job
        assert r["bytes_sent"] == 2 * (2 - 1) * NUMEL * 4 // 2 and r["messages_sent"] == 2


def test_two_nodes_through_srun_rendezvous_like_one_launch(cluster, tmp_path):
    # Two srun tasks on the one node, each a torchrun of one process with --nnodes 2: the
    # multi-node rendezvous of docs/cluster.md, both "nodes" on this host.
    port = free_ports()[0]
    node = (f"{ROOT}/.venv/bin/torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d "
            f"--rdzv-endpoint 127.0.0.1:{port} --rdzv-id srun-$SLURM_JOB_ID "
            f"--rdzv-conf join_timeout=120 {WORKER} {tmp_path / 'two'}")
    two = cluster.run(["srun", "--nodes=1", "--ntasks=2", "--cpus-per-task=1", "bash", "-c", node],
                      timeout=300, cwd=ROOT)
    assert two.returncode == 0, two.stdout + two.stderr
    one = cluster.run(["srun", "--nodes=1", "--ntasks=1", "--cpus-per-task=2",
                       f"{ROOT}/.venv/bin/torchrun", "--standalone", "--nproc-per-node", "2",
                       str(WORKER), str(tmp_path / "one")], timeout=300, cwd=ROOT)
    assert one.returncode == 0, one.stdout + one.stderr
    a, b = launch_result(tmp_path / "one", 2), launch_result(tmp_path / "two", 2)
    same = ("rank", "world_size", "backend", "sum", "bytes_sent", "messages_sent")
    assert [{k: r[k] for k in same} for r in b] == [{k: r[k] for k in same} for r in a]
    assert sorted(r["node_rank"] for r in b) == [0, 1] and [r["local_rank"] for r in b] == [0, 0]
    assert b[0]["sum"] == expected_sum(2)
