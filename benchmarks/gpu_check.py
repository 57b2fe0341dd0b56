"""`make gpu-check`: the course's GPU half in one command, for an instructor on a GPU node.

Five steps, each printed as it starts and ends, everything written under OUT
(default ``results/gpu-HOSTNAME``, the folder lessons 03 and 04 load beside the CPU figures):

    1. GPU tests    pytest -m gpu: NCCL launch, recorder, collectives,   -> pytest.txt
                    ZeRO/FSDP on GPUs, each lab's reference on NCCL vs gloo
    2. collectives  benchmarks/collectives.py on NCCL, 4 KB..256 MB,    -> results.csv, meta.json,
                    the toolkit's algorithms beside NCCL's own             report.html, .txt
    3. DDP step     benchmarks/ddp_step.py (ours vs torch DDP)           -> ddp_step.csv, .txt
    4. FSDP step    benchmarks/fsdp_step.py (ours vs torch FSDP2)        -> fsdp_step.csv, .txt
    5. lessons      every lesson top to bottom (auto picks NCCL with a   -> lessons/NN_*.ipynb
                    GPU per rank); executed copies kept, with outputs      lessons.csv

then summary.txt (one line per step: status, seconds). Exit status 0 when every step passed,
1 when one failed (the others still run), 2 when this machine cannot run it: it stops before
anything starts unless torch is a CUDA build that sees at least 2 GPUs with NCCL.

``--backend gloo`` rehearses the same steps on the CPU (for testing this script), ``--quick``
shrinks sizes and steps, ``--lessons 00,03`` picks lessons.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from toolkit.launch import gpu_count  # noqa: E402

MIN_GPUS = 2  # every collective and step benchmark starts at 2 ranks, one GPU each


def cannot_run() -> str | None:
    """Why this machine cannot run the NCCL checks (None: it can)."""
    gpus = gpu_count()
    cuda = torch.version.cuda
    build = f"torch {torch.__version__} ({'a CPU-only build' if cuda is None else 'CUDA ' + cuda})"
    if torch.version.cuda is None or gpus < MIN_GPUS or not torch.distributed.is_nccl_available():
        return (f"make gpu-check needs a CUDA build of torch with NCCL and at least {MIN_GPUS} "
                f"GPUs; {build} sees {gpus} GPU(s)"
                f"{'' if torch.distributed.is_nccl_available() else ' and has no NCCL'}. "
                "Run it on a GPU node, with your CUDA build of torch installed into .venv first "
                "(README, 'GPU users'). To rehearse the steps on this CPU: "
                "python benchmarks/gpu_check.py --backend gloo --quick")
    return None


def _stream(cmd: list[str], log: Path, timeout: float) -> bool:
    """Run `cmd` from the repository root, its output to the console and to `log`."""
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        deadline = time.monotonic() + timeout
        for line in proc.stdout:  # ends when the process closes its output
            sys.stdout.write("    " + line)
            f.write(line)
            if time.monotonic() > deadline:
                proc.kill()
                f.write(f"\ngpu_check: stopped after {timeout:g} s\n")
                break
        return proc.wait() == 0


def _lessons(names: list[str] | None, out: Path) -> bool:
    spec = importlib.util.spec_from_file_location("lesson_resources",
                                                  ROOT / "benchmarks" / "lesson_resources.py")
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    paths = sorted((ROOT / "lessons").glob("[0-9][0-9]_*.ipynb"))
    if names:
        paths = [p for p in paths if p.name[:2] in names]
    (out / "lessons").mkdir(exist_ok=True)
    rows, ok = [], True
    for path in paths:
        try:
            wall, peak = runner.run(path, save_to=out / "lessons" / path.name)
            status = "ok"
        except Exception as exc:  # noqa: BLE001 - a failed lesson is reported, the rest still run
            first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
            wall, peak, status, ok = float("nan"), 0, f"failed: {first}", False
        print(f"    {path.name:<36} {wall:7.1f} s  {peak / 2**20:6.0f} MB  {status}", flush=True)
        rows.append([path.name, round(wall, 1), round(peak / 2**20), status])
    with open(out / "lessons.csv", "w", newline="") as f:
        csv.writer(f).writerows([["lesson", "seconds", "peak MB (PSS)", "status"], *rows])
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--out", type=Path, help="results folder (default results/gpu-HOSTNAME)")
    ap.add_argument("--backend", default="nccl", choices=["nccl", "gloo"],
                    help="nccl (default); gloo rehearses the steps on the CPU")
    ap.add_argument("--quick", action="store_true", help="small sizes and few steps")
    ap.add_argument("--lessons", help="comma list of lesson numbers (default: all)")
    args = ap.parse_args(argv)
    if args.backend == "nccl" and (why := cannot_run()):
        print(f"gpu-check: {why}", file=sys.stderr)
        return 2

    out = (args.out or ROOT / "results" / f"gpu-{socket.gethostname()}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    gpus = gpu_count() if args.backend == "nccl" else 0
    worlds = [p for p in (2, 4, 8) if p <= gpus] or [2]
    ranks = [str(p) for p in worlds]
    py, bench = sys.executable, ROOT / "benchmarks"
    sizes, steps = ("4K,64K", "3") if args.quick else ("4K:256M", None)
    small = ["--width", "256", "--steps", "3"] if args.quick else []
    print(f"gpu-check on {socket.gethostname()}: {gpus} GPU(s), {args.backend}, world sizes "
          f"{worlds}, torch {torch.__version__}; writing {out}", flush=True)
    plan = [
        ("GPU tests", lambda: _stream(
            [py, "-m", "pytest", "-m", "gpu", "tests/test_gpu.py", "tests/test_gpu_course.py",
             "-k", "not lesson", "-q", "-rs", "-p", "no:cacheprovider"], out / "pytest.txt", 3600)),
        ("collectives", lambda: _stream(
            [py, str(bench / "collectives.py"), "--backend", args.backend,
             "--algorithms", "ring,tree,ps,sharded_ps,torch", "--sizes", sizes,
             "--world-sizes", ",".join(ranks), "--out", str(out)]
            # quick: a fixed number of rounds, none added to pin the ratio down
            + (["--repeats", steps, "--max-repeats", steps] if steps else []),
            out / "collectives.txt", 3600)),
        ("DDP step", lambda: _stream(
            [py, str(bench / "ddp_step.py"), "--backend", args.backend, "--ranks", *ranks,
             "--out", str(out / "ddp_step.csv"), *small], out / "ddp_step.txt", 1800)),
        ("FSDP step", lambda: _stream(
            [py, str(bench / "fsdp_step.py"), "--backend", args.backend, "--ranks", *ranks,
             "--out", str(out / "fsdp_step.csv"), *small], out / "fsdp_step.txt", 1800)),
        ("lessons", lambda: _lessons(args.lessons.split(",") if args.lessons else None, out)),
    ]
    summary = []
    for i, (name, step) in enumerate(plan, 1):
        print(f"[{i}/{len(plan)}] {name}", flush=True)
        t0 = time.perf_counter()
        passed = step()
        seconds = time.perf_counter() - t0
        summary.append(f"{name:<12} {'ok' if passed else 'FAILED':<7} {seconds:7.0f} s")
        print(f"[{i}/{len(plan)}] {summary[-1]}", flush=True)
    (out / "summary.txt").write_text("\n".join(summary) + "\n")
    print("\n".join(["gpu-check summary:", *summary, f"results in {out}"]))
    return 0 if all(" ok " in s for s in summary) else 1


if __name__ == "__main__":
    sys.exit(main())
