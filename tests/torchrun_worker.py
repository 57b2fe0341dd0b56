"""A toolkit worker the torchrun and SLURM tests start: ``torchrun ... torchrun_worker.py [OUT]``.

Each rank runs the toolkit's ring all-reduce (isend/irecv, recorded) on rank-dependent data and
writes what it saw to OUT/rank<R>.json (OUT: ./results by default): the result, its recorded
traffic, and where it ran (torchrun's GROUP_RANK / LOCAL_RANK, SLURM's job id). Every rank
writes its own file: on a shared stdout their prints interleave.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

NUMEL = 10  # not divisible by 4: uneven ring chunks


def work(rank: int, world_size: int) -> dict:
    import torch

    from toolkit import collectives as C
    from toolkit import comm
    from toolkit.launch import context, device

    x = torch.arange(NUMEL, dtype=torch.float32, device=device()) * (rank + 1)
    with comm.recording() as trace:
        C.ring_all_reduce(x)
    mine = trace.totals()[rank]
    return {"rank": rank, "world_size": world_size, "backend": context().backend,
            "sum": x.tolist(), "bytes_sent": mine.bytes_sent, "messages_sent": mine.messages_sent,
            "node_rank": int(os.environ.get("GROUP_RANK", -1)),
            "local_rank": context().local_rank, "slurm_job": os.environ.get("SLURM_JOB_ID")}


def launch_result(out: Path, world_size: int) -> list[dict]:
    """Every rank's record, by rank (a missing file fails the caller's comparison)."""
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world_size)]


def expected_sum(world_size: int) -> list[float]:
    return [float(i * sum(range(1, world_size + 1))) for i in range(NUMEL)]


def run_all(cmds: list[list[str]], *, timeout: float,
            **kwargs) -> list[subprocess.CompletedProcess]:
    """Run `cmds` at once, each with its output captured, all within `timeout` seconds. On
    timeout every one still running gets SIGTERM (torchrun then stops its ranks; SIGKILL would
    orphan them in their own sessions), SIGKILL 30 s later."""
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              **kwargs) for cmd in cmds]
    deadline, outs = time.monotonic() + timeout, []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in procs:
                if other.poll() is None:
                    other.send_signal(signal.SIGTERM)
            try:
                out, _ = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
            out += f"\n(stopped after {timeout:g} s)"
        outs.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, ""))
    return outs


if __name__ == "__main__":
    from toolkit.launch import run_from_env

    result = run_from_env(work)
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "results")
    target.mkdir(parents=True, exist_ok=True)
    (target / f"rank{result['rank']}.json").write_text(json.dumps(result))
