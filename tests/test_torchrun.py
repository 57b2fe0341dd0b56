"""The same worker function under torchrun, through run_from_env / init_from_env."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from toolkit.launch import init_from_env

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
