"""What starting one rank of a grade costs, in the fork server's shoes (issue 30).

1. A plain fork of a process holding torch (the sandbox before issue 30, and ``--unconfined``).
2. The sandbox's rank: `namespaces.fork_isolated` (pid 1 of a pid namespace of its own), its
   other namespaces, its world (`world.build`: read-only binds, procfs, tmpfs $HOME,
   pivot_root) and its uid, as the fork server does it for a CPU grade. Run as root: the
   one-fork path; as a user: the two-fork one (user namespaces needed).
3. A fresh interpreter that imports torch: what a rank would cost if a sandbox had to exec it
   (bubblewrap's way: it builds a sandbox, then execs a program in it).
4. How many launches and ranks one grade of each lab starts (`grade.plan`): what each of the
   above is multiplied by.

Usage: python benchmarks/rank_start.py [--repeats 20] [--save | --record FILE.json]
Times vary with the machine's load: read the median, and run it twice. ``--save`` records the
figures in benchmarks/results/rank_start.json (`saved`), where docs/grading.md reads them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch  # noqa: F401 - the fork server's memory: forks copy its page tables
import torch.distributed  # noqa: F401

from autograder.sandbox import namespaces
from autograder.sandbox.limits import become, rank_uid, sandbox_uid
from autograder.sandbox.paths import world_spec
from autograder.sandbox.world import build

sys.path.insert(0, str(Path(__file__).resolve().parent))
import saved  # noqa: E402  (benchmarks/saved.py)

ABOUT = ("Starting one rank, milliseconds (median, min, max, runs): a plain fork of a process "
         "holding torch, the sandbox's rank (fork, namespaces, world, uid), a fresh interpreter "
         "importing torch; launches and ranks one grade of each lab starts. Keyed by who ran "
         "it (root: the one-fork path). benchmarks/rank_start.py --save.")
KEYS = {"plain fork (before; --unconfined)": "plain_fork",
        "sandboxed rank (fork, namespaces, world, uid)": "sandboxed_rank",
        "fresh interpreter importing torch (exec)": "fresh_interpreter"}


def plain() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def sandboxed(code: Path, root: Path) -> None:
    uid = rank_uid(sandbox_uid(), 0)

    def child() -> None:
        code_ = 1
        try:
            namespaces.unshare_rest()
            build(world_spec(code, root / "r0", root, gpu=False, home_bytes=1 << 20,
                             home_inodes=100, owner=os.geteuid() if uid is None else uid))
            become(uid)
            code_ = 0
        finally:
            os._exit(code_)

    pid = namespaces.fork_isolated(child)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        raise RuntimeError(f"the sandboxed rank failed (wait status {status})")


def fresh_interpreter() -> None:
    subprocess.run([sys.executable, "-c", "import torch, torch.distributed"], check=True)


def timed(step, repeats: int) -> list[float]:
    step()  # warm
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        out.append((time.perf_counter() - start) * 1e3)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20, help="runs of each (default 20)")
    saved.add_arguments(parser, "rank_start")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    save_to = saved.target(parser, args, "rank_start")
    load_before = saved.load_average()
    namespaces.set_subreaper()
    with tempfile.TemporaryDirectory(prefix="grade-") as work:
        code, root = Path(work) / "code", Path(work) / "launch-0"
        code.mkdir()
        root.mkdir()
        rows = [("plain fork (before; --unconfined)", timed(plain, args.repeats)),
                ("sandboxed rank (fork, namespaces, world, uid)",
                 timed(lambda: sandboxed(code, root), args.repeats)),
                ("fresh interpreter importing torch (exec)",
                 timed(fresh_interpreter, max(3, args.repeats // 5)))]
    from autograder.grade import plan
    from autograder.lab import load_lab

    labs = sorted(p for p in (Path(__file__).resolve().parents[1] / "labs").iterdir()
                  if (p / "checks.py").is_file())
    per_lab = {}
    for lab in labs:
        launches, _ = plan(load_lab(lab), 1)
        per_lab[lab.name] = {"launches": len(launches),
                             "ranks": sum(launch.key.world_size for launch in launches)}
        print(f"{lab.name}: {per_lab[lab.name]['launches']} launches, "
              f"{per_lab[lab.name]['ranks']} ranks per grade")
    who = "root" if os.geteuid() == 0 else "a user"
    print(f"Starting one rank, as {who}, load average {os.getloadavg()[0]:.1f}:")
    for name, ms in rows:
        print(f"  {name:48s} median {statistics.median(ms):8.1f} ms  "
              f"(min {min(ms):.1f}, max {max(ms):.1f}, {len(ms)} runs)")
    saved.record(save_to, "rank_start", f"as {who}", {
        "who": who, "labs": per_lab,
        **{KEYS[name]: {"median_ms": round(statistics.median(ms), 2),
                        "min_ms": round(min(ms), 2), "max_ms": round(max(ms), 2),
                        "runs": len(ms)} for name, ms in rows}},
        about=ABOUT, load_before=load_before, argv=argv)


if __name__ == "__main__":
    main()
