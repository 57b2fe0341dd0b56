"""`make gpu-check`: the course's GPU half in one command, on the GPU(s) this machine has.

Eight steps, each printed as it starts, as it runs (its own output, indented) and as it ends;
everything written under OUT (default ``results/gpu-HOSTNAME``):

    1. environment   torch, CUDA, the GPUs (NVML), the fork-safety check (CPU ranks forked on
                     this GPU machine run a backward and Adam), the placement's smoke test
                     (an all-reduce and an isend/irecv ring on the GPUs), the address space
                     a torch process maps against the grader's per-rank limit, how long a
                     grader's fork server takes to start                  -> environment.json
    2. GPU figures   matmul TFLOP/s per dtype, host<->device and device copies -> device.json
    3. GPU tests     pytest -m gpu (tests/test_gpu.py, the labs of test_gpu_course.py)
                                                                                 -> pytest.txt
    4. grading       a CPU grade of lab 01 (timed: it printed nothing for 100 s on a GPU node
                     before), then labs 01, 02, 03, 06 graded on the GPUs   -> grades/*.json
    5. collectives   benchmarks/collectives.py: the toolkit's algorithms beside torch's
                                                   -> results.csv, meta.json, report.html
    6. DDP step      benchmarks/ddp_step.py (ours vs torch DDP)             -> ddp_step.csv
    7. FSDP step     benchmarks/fsdp_step.py (ours vs torch FSDP2)          -> fsdp_step.csv
    8. lessons       lessons 00 and 02 with TOOLKIT_DEVICE=cuda  -> lessons/*.ipynb, lessons.csv

then summary.txt. Placement: two or more GPUs, NCCL with one GPU per rank at 2, 4 (and 8)
ranks; one GPU, the ranks share it (gloo on CUDA tensors, point-to-point staged through host
memory) at 2 ranks, and the GPU tests add NCCL at world size 1. Every step has a time cap and
the whole run a budget (``--budget``, 480 s): a step that would start past it is reported as
not run. Exit status 0 when every step passed, 1 when one failed (the others still run), 2 when
this machine has no GPU to check (nothing starts).

``--device cpu --quick`` rehearses every step on the CPU (tests/test_gpu_check.py runs it);
``--dry-run`` prints the plan and the commands without running them. ``--save`` records each
step's status and seconds in benchmarks/results/gpu_check.json (docs/cluster.md's "How long" is
written from it by benchmarks/figures_page.py), ``--record FILE.json`` into another file.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from toolkit.launch import (  # noqa: E402
    driver_live,
    gpu_count,
    resolve_placement,
    spawn,
    visible_gpus,
)
from toolkit.launch.gpus import hidden_cuda_env  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
import saved  # noqa: E402  (benchmarks/saved.py)

GRADED_LABS = ("01_collectives", "02_ddp", "03_sharded_optimizer", "06_mixed_precision")
LESSONS = ("00", "02")


@dataclass
class Plan:
    """What this machine runs: the device, the GPUs, the placement and the world sizes."""

    device: str
    """"cuda" or "cpu" (a rehearsal)."""
    gpus: int
    placement: str
    """"gpu" (NCCL, a GPU per rank), "shared" (one GPU for every rank) or "cpu"."""
    worlds: list[int]
    quick: bool = False
    lessons: tuple[str, ...] = LESSONS

    @classmethod
    def for_machine(cls, device: str = "auto", quick: bool = False) -> "Plan":
        gpus = gpu_count() if device != "cpu" else 0  # NVML: the driver stays asleep here
        if device == "cpu" or (device == "auto" and gpus == 0):
            return cls("cpu", 0, "cpu", [2], quick)
        worlds = [p for p in (2, 4, 8) if p <= gpus] or [2]
        placement = resolve_placement("auto", "cuda", max(worlds), gpus=gpus).kind
        return cls("cuda", gpus, placement, worlds, quick)


def cannot_run(plan: Plan, asked: str) -> str | None:
    """Why this machine cannot run the GPU checks (None: it can)."""
    if plan.device == "cuda" or asked == "cpu":
        return None
    build = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
    return (f"make gpu-check needs a GPU: torch {torch.__version__} ({build}) sees "
            f"{gpu_count()} GPU(s). Run it on a GPU node, in the Python that holds its CUDA "
            "torch (docs/cluster.md: GPU_PYTHON=...). To rehearse the steps on this CPU: "
            "python benchmarks/gpu_check.py --device cpu --quick")


# -- running a step -----------------------------------------------------------------------------

def stream(cmd: list[str], log: Path, timeout: float, env: dict | None = None) -> bool:
    """Run `cmd` from the repository root in a session of its own, its output indented on the
    console and kept in `log`; past `timeout` s it gets SIGTERM (the grader cleans up on it),
    then SIGKILL. True when it exited with status 0."""
    with open(log, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace", start_new_session=True,
                                env={**os.environ, **(env or {})})

        def pump() -> None:
            for line in proc.stdout:
                sys.stdout.write("    " + line)
                sys.stdout.flush()
                f.write(line)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            for sig, grace in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
                try:
                    os.killpg(proc.pid, sig)
                    code = proc.wait(grace)
                    break
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    continue
            print(f"    gpu-check: stopped after {timeout:.0f} s", flush=True)
            reader.join(5)
            f.write(f"\ngpu-check: stopped after {timeout:.0f} s\n")
            return False
        reader.join(5)
        return code == 0


def _train(rank: int, world_size: int) -> str:
    """The run that failed on a GPU node before: a backward and an Adam step in forked CPU
    ranks (Adam asks torch.cuda.is_available() on a CUDA build)."""
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    torch.nn.functional.mse_loss(model(torch.randn(4, 8)), torch.zeros(4, 4)).backward()
    opt.step()
    return os.environ.get("CUDA_VISIBLE_DEVICES", "unset")


def _smoke(rank: int, world_size: int) -> dict:
    """On the plan's placement: an all-reduce, and a ring of isend/irecv (staged through host
    memory when the ranks share a GPU), values checked by the caller."""
    import torch.distributed as dist

    from toolkit.launch import context

    ctx = context()
    t = torch.full((4,), float(rank + 1), device=ctx.device)
    dist.all_reduce(t)
    got = torch.zeros(3, device=ctx.device)
    works = [dist.irecv(got, (rank - 1) % world_size),
             dist.isend(torch.full((3,), float(rank), device=ctx.device), (rank + 1) % world_size)]
    for w in works:
        w.wait()
    return {"backend": ctx.backend, "device": str(ctx.device), "placement": ctx.placement,
            "sum": t[0].item(), "from_left": got[0].item()}


def environment(plan: Plan, out: Path, budget: float) -> bool:
    ok = True
    facts = {"torch": torch.__version__, "cuda": torch.version.cuda, "cores": os.cpu_count(),
             "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
             "gpus": [g.name for g in visible_gpus()], "placement": plan.placement,
             "world_sizes": plan.worlds}
    print(f"    {json.dumps(facts)}", flush=True)
    facts["driver_live_before"] = live = driver_live()
    print(f"    CUDA driver started in this process before launching: {live} (must be False)")
    ok &= not live
    forked = spawn(_train, 2, device="cpu", timeout=min(120, budget), echo=False)
    print(f"    CPU ranks forked on this machine ran a backward and Adam: ok "
          f"(their CUDA_VISIBLE_DEVICES={forked[0]!r})", flush=True)
    p = plan.worlds[0]
    smoke = spawn(_smoke, p, device=plan.device, timeout=min(180, budget), echo=False)
    right = [s["sum"] == p * (p + 1) / 2 and s["from_left"] == (r - 1) % p
             for r, s in enumerate(smoke)]
    print(f"    {p} ranks on {smoke[0]['backend']}, placement {smoke[0]['placement']}, devices "
          f"{[s['device'] for s in smoke]}: all-reduce and isend/irecv ring "
          f"{'correct' if all(right) else 'WRONG'}", flush=True)
    ok &= all(right)
    facts["smoke"] = smoke
    from autograder.sandbox.limits import Limits

    code = "import torch, torch.distributed; print([l for l in open('/proc/self/status') " \
           "if l.startswith('VmSize')][0].split()[1])"
    vm_kb = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               timeout=min(120, budget)).stdout.strip() or 0)
    limit = Limits().memory_mb
    facts.update(vm_size_mb=vm_kb // 1024, grader_rank_address_space_mb=limit)
    print(f"    a process that imported torch maps {vm_kb // 1024} MiB; the grader lets each "
          f"CPU rank map {limit} MiB more than that (Limits.memory_mb on top of "
          "limits.address_space_now: an absolute cap below it failed every allocation)",
          flush=True)
    # What the grader's fork server does before it says "ready" (its warm-up runs a backward,
    # which asks CUDA for its GPU count), timed with the GPUs hidden as on a CPU grade: the
    # grader waits for it, silently, up to the grade's whole budget.
    warm = ("import time; t = time.perf_counter(); import torch, torch.distributed; "
            "m = torch.nn.Linear(4, 3); m(torch.randn(2, 4)).sum().backward(); "
            "print(round(time.perf_counter() - t, 2))")
    t0 = time.perf_counter()
    run = subprocess.run([sys.executable, "-c", warm], capture_output=True, text=True,
                         timeout=min(120, budget), env={**os.environ, **hidden_cuda_env()})
    facts["fork_server_start_s"] = float(run.stdout.strip() or "nan")
    print(f"    a fork server's start (import torch, a backward; GPUs hidden): "
          f"{run.stdout.strip() or run.stderr.strip()[-300:]} s inside, "
          f"{time.perf_counter() - t0:.1f} s with the interpreter", flush=True)
    (out / "environment.json").write_text(json.dumps(facts, indent=2) + "\n")
    return ok


def grading(plan: Plan, out: Path, budget: float) -> bool:
    grades = out / "grades"
    grades.mkdir(exist_ok=True)
    runs = [("01_collectives", "cpu")]
    if plan.device == "cuda":
        runs += [(lab, "cuda") for lab in GRADED_LABS]
    ok, end = True, time.monotonic() + budget
    for lab, device in runs:
        left = end - time.monotonic()
        if left < 20:
            print(f"    {lab} on {device}: not run (budget)", flush=True)
            ok = False
            continue
        result = grades / f"{lab}-{device}.json"
        cmd = [sys.executable, "-m", "autograder", "grade", f"labs/{lab}", "--device", device,
               "--json", str(result), "--no-color", "--progress",
               "--timeout", str(int(min(150, left - 10)))]
        t0 = time.perf_counter()
        stream(cmd, grades / f"{lab}-{device}.txt", min(180, left), env={"FORCE_COLOR": "0"})
        score = json.loads(result.read_text()).get("score") if result.is_file() else None
        print(f"    {lab} on {device}: score {score} in {time.perf_counter() - t0:.0f} s",
              flush=True)
        ok &= score == 100
    return ok


def steps(plan: Plan, out: Path) -> list[tuple[str, float, Callable[[float], bool]]]:
    """(name, cap in seconds, run(budget) -> passed) for every step, in order."""
    py, bench, q = sys.executable, ROOT / "benchmarks", plan.quick
    dev, ranks = ["--device", plan.device], [str(p) for p in plan.worlds]
    sizes = "4K,64K" if q else ("4K:16M:4" if plan.placement != "gpu" else "4K:256M:4")
    rounds = ["--repeats", "3", "--max-repeats", "3" if q else "5"]
    small = ["--width", "256", "--steps", "3"] if q else ["--steps", "10"]
    lessons = [str(p) for n in plan.lessons for p in sorted(ROOT.glob(f"lessons/{n}_*.ipynb"))]
    tests = [py, "-m", "pytest", "-o", "addopts=", "-p", "no:cacheprovider", "-q", "-rs",
             "-m", "gpu", "tests/test_gpu.py", "tests/test_gpu_course.py", "-k", "not lesson"]

    def run(cmd: list[str], log: str, env: dict | None = None) -> Callable[[float], bool]:
        return lambda budget: stream(cmd, out / log, budget, env)

    return [
        ("environment", 240, lambda budget: environment(plan, out, budget)),
        ("GPU figures", 120, run([py, str(bench / "gpu_figures.py"), *dev, "--out", str(out)]
                                 + (["--quick"] if q else []), "gpu_figures.txt")),
        ("GPU tests", 240, run(tests, "pytest.txt")),
        ("grading", 330, lambda budget: grading(plan, out, budget)),
        ("collectives", 150, run([py, str(bench / "collectives.py"), *dev, "--algorithms",
                                  "ring,tree,ps,sharded_ps,torch", "--sizes", sizes,
                                  "--world-sizes", ",".join(ranks), *rounds, "--out", str(out)],
                                 "collectives.txt")),
        ("DDP step", 90, run([py, str(bench / "ddp_step.py"), *dev, "--ranks", *ranks,
                              "--out", str(out / "ddp_step.csv"), *small], "ddp_step.txt")),
        ("FSDP step", 90, run([py, str(bench / "fsdp_step.py"), *dev, "--ranks", *ranks,
                               "--out", str(out / "fsdp_step.csv"), *small], "fsdp_step.txt")),
        ("lessons", 180, run([py, str(bench / "lesson_resources.py"), *lessons, "--save-to",
                              str(out / "lessons"), "--csv", str(out / "lessons.csv")],
                             "lessons.txt", env={"TOOLKIT_DEVICE": plan.device})),
    ]


@dataclass
class Summary:
    lines: list[str] = field(default_factory=list)
    steps: list[tuple[str, str, float]] = field(default_factory=list)
    """(step, status, seconds) as each ended."""
    passed: bool = True


ABOUT = ("Each step of `make gpu-check` (benchmarks/gpu_check.py): its status and seconds, the "
         "placement and the budget; key: the device checked ('cpu' for a rehearsal).")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--out", type=Path, help="results folder (default results/gpu-HOSTNAME)")
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"],
                    help="auto/cuda: this machine's GPUs (default); cpu: a rehearsal")
    ap.add_argument("--quick", action="store_true", help="small sizes and few steps")
    ap.add_argument("--lessons", help=f"comma list of lesson numbers (default {','.join(LESSONS)})")
    ap.add_argument("--budget", type=float, default=480.0,
                    help="seconds for the whole run (default 480); later steps are not run")
    ap.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    saved.add_arguments(ap, "gpu_check")
    args = ap.parse_args(argv)
    save_to = saved.target(ap, args, "gpu_check")
    plan = Plan.for_machine(args.device, args.quick)
    if args.lessons:
        plan.lessons = tuple(args.lessons.split(","))
    if why := cannot_run(plan, args.device):
        print(f"gpu-check: {why}", file=sys.stderr)
        return 2
    host = socket.gethostname()
    out = (args.out or ROOT / "results" / f"{'gpu' if plan.device == 'cuda' else 'cpu'}-{host}")
    out = out.resolve()
    plan_steps = steps(plan, out)
    print(f"gpu-check on {host}: {plan.gpus} GPU(s), placement {plan.placement}, world sizes "
          f"{plan.worlds}, torch {torch.__version__}, budget {args.budget:.0f} s; writing {out}",
          flush=True)
    if args.dry_run:
        for i, (name, cap, _) in enumerate(plan_steps, 1):
            print(f"[{i}/{len(plan_steps)}] {name} (at most {cap} s)")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    load_before = saved.load_average()
    summary, end = Summary(), time.monotonic() + args.budget
    for i, (name, cap, step) in enumerate(plan_steps, 1):
        left = end - time.monotonic()
        print(f"[{i}/{len(plan_steps)}] {name}", flush=True)
        t0 = time.perf_counter()
        if left < 15:
            passed, status = False, "not run (budget)"
        else:
            try:
                passed = step(min(cap, left))
            except Exception as exc:  # noqa: BLE001 - a failed step is reported, the rest run
                print(f"    {type(exc).__name__}: {str(exc)[:2000]}", flush=True)
                passed = False
            status = "ok" if passed else "FAILED"
        took = time.perf_counter() - t0
        summary.steps.append((name, status, took))
        summary.lines.append(f"{name:<12} {status:<17} {took:6.0f} s")
        summary.passed &= passed
        print(f"[{i}/{len(plan_steps)}] {summary.lines[-1]}", flush=True)
    (out / "summary.txt").write_text("\n".join(summary.lines) + "\n")
    print("\n".join(["gpu-check summary:", *summary.lines, f"results in {out}"]), flush=True)
    saved.record(save_to, "gpu_check", plan.device if plan.device == "cpu" else
                 f"{plan.gpus} GPU(s)", {
                     "gpus": plan.gpus, "placement": plan.placement, "worlds": list(plan.worlds),
                     "quick": args.quick, "lessons": list(plan.lessons), "budget_s": args.budget,
                     "steps": [list(step) for step in summary.steps],
                     "total_s": sum(s for _, _, s in summary.steps)},
                 about=ABOUT, load_before=load_before, argv=argv)
    return 0 if summary.passed else 1


if __name__ == "__main__":
    sys.exit(main())
