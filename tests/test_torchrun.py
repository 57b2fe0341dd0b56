"""The same worker function under torchrun, through run_from_env / init_from_env."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from procs import free_ports
from torchrun_worker import NUMEL, expected_sum, launch_result, run_all

from toolkit.launch import init_from_env

WORKER = Path(__file__).with_name("torchrun_worker.py")

SCRIPT = textwrap.dedent("""
    import torch, torch.distributed as dist
    from toolkit import comm
    from toolkit.launch import context, run_from_env

    def work(rank, world_size):
        ctx = context()
        t = torch.tensor([float(rank)])
        with comm.recording() as trace:
            dist.all_reduce(t)
        sent = trace.totals()[rank].collective_bytes
        return ctx.rank, ctx.world_size, ctx.backend, t.item(), sent

    if __name__ == "__main__":
        import os, sys
        result = run_from_env(work)
        with open(os.path.join(sys.argv[1], f"rank{result[0]}.txt"), "w") as f:
            f.write(repr(result))
""")


@pytest.mark.slow
@pytest.mark.multirank
def test_worker_runs_under_torchrun(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT")}
    p = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(script), str(tmp_path)], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    # Each rank writes its own file: on torchrun's shared stdout their prints interleave.
    found = [(tmp_path / f"rank{r}.txt").read_text() for r in range(2)]
    assert found == ["(0, 2, 'gloo', 1.0, 4)", "(1, 2, 'gloo', 1.0, 4)"]


def test_init_from_env_outside_torchrun_says_how_to_launch(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(RuntimeError, match="torchrun --nproc-per-node"):
        init_from_env()


@pytest.mark.slow
@pytest.mark.multirank
def test_two_node_rendezvous_on_one_host_equals_one_launch(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT")}
    run = [sys.executable, "-m", "torch.distributed.run"]
    [single] = run_all([run + ["--standalone", "--nproc-per-node", "2", str(WORKER),
                               str(tmp_path / "one")]], timeout=180, env=env)
    assert single.returncode == 0, single.stdout
    # docs/cluster.md's several-nodes command, both "nodes" on this host: c10d rendezvous on a
    # free port, one process per node.
    endpoint = f"127.0.0.1:{free_ports()[0]}"
    nodes = [run + ["--nnodes", "2", "--node-rank", str(i), "--nproc-per-node", "1",
                    "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
                    "--rdzv-id", "two-nodes", "--rdzv-conf", "join_timeout=120",
                    str(WORKER), str(tmp_path / "two")] for i in (0, 1)]
    for node in run_all(nodes, timeout=240, env=env):
        assert node.returncode == 0, node.stdout
    one, two = launch_result(tmp_path / "one", 2), launch_result(tmp_path / "two", 2)
    same = ("rank", "world_size", "backend", "sum", "bytes_sent", "messages_sent")
    assert [{k: r[k] for k in same} for r in two] == [{k: r[k] for k in same} for r in one]
    # ring: 2(p − 1)/p · n elements of 4 bytes from every rank
    assert one[0]["sum"] == expected_sum(2) and one[0]["bytes_sent"] == 2 * (2 - 1) * NUMEL * 4 // 2
    assert sorted(r["node_rank"] for r in two) == [0, 1]  # two nodes, as the rendezvous saw them
    assert [r["local_rank"] for r in two] == [0, 0] and {r["node_rank"] for r in one} == {0}
