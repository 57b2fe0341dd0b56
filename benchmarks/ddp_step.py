"""Training-step time of the from-scratch DDPs against torch's DistributedDataParallel.

One run, printed side by side: for 2 and 4 ranks, the time of one step (zero_grad, forward,
backward with gradient averaging, SGD step) with

    torch DDP    torch.nn.parallel.DistributedDataParallel (C++ reducer, buckets, overlap)
    naive        toolkit NaiveDDP: one all-reduce per parameter, after backward
    bucketed     toolkit BucketedDDP: one all-reduce per bucket, after backward
    overlapped   toolkit OverlappedDDP: bucket all-reduces launched during backward

on the same model (a TinyMLP of a few million parameters, so that the gradient all-reduce is
a sizeable part of the step) and the same data. Every variant uses the same bucket cap.
A step's time is the slowest rank's (each step starts after a barrier); the table shows the
median over steps, with the variants taking turns step by step so that a busy moment of the
machine does not fall on one variant only. "vs torch" is the ratio to torch DDP.

Usage: python benchmarks/ddp_step.py [--ranks 2 4] [--steps 40] [--bucket-cap-mb 4]
                                     [--backend auto|gloo|nccl] [--device auto|cpu|cuda]
                                     [--out ddp_step.csv]
Times vary ±30 % on a shared 2-core machine: read the ratios, and run it twice. On a GPU node
(``--backend auto`` picks NCCL with a GPU per rank) model and data live on each rank's GPU and
every step is timed to the end of its kernels (`torch.cuda.synchronize`). ``--out`` writes the
table as CSV (`make gpu-check` puts it in the results folder that lesson 04 reads).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from toolkit.data_parallel.ddp import BucketedDDP, NaiveDDP, OverlappedDDP
from toolkit.launch import context, device, spawn
from toolkit.models import TinyMLP, count_parameters

sys.path.insert(0, str(Path(__file__).resolve().parent))
import saved  # noqa: E402  (benchmarks/saved.py)

VARIANTS = ("torch DDP", "naive", "bucketed", "overlapped")
ABOUT = ("One training step of each DDP variant on p ranks, seconds (median over steps of the "
         "slowest rank), and its ratio to torch's DistributedDataParallel; the model's "
         "parameters and gradient bytes. benchmarks/ddp_step.py --save.")


def _model(args: argparse.Namespace) -> TinyMLP:
    return TinyMLP(d_in=args.width // 4, d_hidden=args.width, d_out=args.width // 4,
                   depth=args.depth, seed=0)


def _wrap(name: str, model: torch.nn.Module, cap: float) -> torch.nn.Module:
    if name == "torch DDP":
        dev = device()
        ids = [dev.index] if dev.type == "cuda" else None  # one GPU per process
        return DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=cap)
    if name == "naive":
        return NaiveDDP(model)
    return {"bucketed": BucketedDDP, "overlapped": OverlappedDDP}[name](model, bucket_cap_mb=cap)


def _steps(ddp: torch.nn.Module, opt: torch.optim.Optimizer, x, y, n: int) -> list[float]:
    # CUDA kernels run asynchronously: time a step to the end of its last kernel.
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    times = []
    for _ in range(n):
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        F.mse_loss(ddp(x), y).backward()
        opt.step()
        sync()
        times.append(time.perf_counter() - t0)
    return times


def _bench(rank: int, world_size: int, args: argparse.Namespace) -> dict:
    dev = device()  # cpu on gloo, this rank's GPU on NCCL
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch, args.width // 4, generator=gen).to(dev)
    y = torch.randn(args.batch, args.width // 4, generator=gen).to(dev)
    runs = {}
    for name in VARIANTS:
        model = _model(args).to(dev)
        ddp = _wrap(name, model, args.bucket_cap_mb)
        opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
        _steps(ddp, opt, x, y, 3)  # warm-up (torch DDP rebuilds its buckets after step 1)
        runs[name] = (ddp, opt)
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    # One step of each variant in turn, the order rotating: a busy second of the shared machine
    # then costs every variant alike.
    for r in range(args.steps):
        order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]
        for name in order:
            times[name] += _steps(*runs[name], x, y, 1)
    buckets = {name: len(ddp.buckets) if hasattr(ddp, "buckets") else
               len(ddp.sync_params) if hasattr(ddp, "sync_params") else None
               for name, (ddp, _) in runs.items()}
    return {"times": times, "buckets": buckets, "where": f"{context().backend}, {dev}"
            + (" (ranks share the GPUs)" if context().placement == "shared" else "")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=40, help="timed steps per variant")
    parser.add_argument("--width", type=int, default=1024, help="hidden width of the TinyMLP")
    parser.add_argument("--depth", type=int, default=3, help="hidden layers of the TinyMLP")
    parser.add_argument("--batch", type=int, default=32, help="items per rank per step")
    parser.add_argument("--bucket-cap-mb", type=float, default=4.0)
    parser.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"],
                        help="auto: NCCL when there is a GPU per rank, else gloo")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"],
                        help="cuda: the GPUs there are, shared by the ranks when fewer (gloo); "
                        "default: $TOOLKIT_DEVICE, else auto")
    parser.add_argument("--out", help="also write the table to this CSV file")
    saved.add_arguments(parser, "ddp_step")
    args = parser.parse_args(argv)
    if min(args.ranks) < 1 or args.steps < 1 or args.width < 4 or args.depth < 1:
        parser.error("--ranks and --steps must be >= 1, --width >= 4, --depth >= 1")
    save_to = saved.target(parser, args, "ddp_step")

    n_params = count_parameters(_model(args))
    print(f"model: TinyMLP width {args.width}, depth {args.depth}: {n_params:,} parameters, "
          f"{n_params * 4 / 2**20:.1f} MiB of fp32 gradients per step; batch {args.batch} per "
          f"rank; bucket cap {args.bucket_cap_mb} MiB; torch {torch.__version__}", flush=True)
    table: dict[int, dict[str, float]] = {}
    buckets: dict[str, int | None] = {}
    for p in args.ranks:
        load_before = saved.load_average()
        results = spawn(_bench, p, args, backend=args.backend, device=args.device, timeout=600,
                        echo=False)
        print(f"{p} ranks on {results[0]['where']} (rank 0)", flush=True)
        # Slowest rank per step (they finish together after the all-reduces), median of steps.
        table[p] = {name: statistics.median(max(step) for step in
                                            zip(*(r["times"][name] for r in results)))
                    for name in VARIANTS}
        buckets = results[0]["buckets"]
        saved.record(save_to, "ddp_step", f"{p} ranks", {
            "ranks": p, "where": results[0]["where"], "parameters": n_params,
            "gradient_bytes": n_params * 4, "steps": args.steps,
            "bucket_cap_mib": args.bucket_cap_mb, "step_s": table[p],
            "vs_torch": {name: table[p][name] / table[p]["torch DDP"] for name in VARIANTS},
            "all_reduces_per_step": buckets}, about=ABOUT, load_before=load_before, argv=argv)

    head = f"{'variant':<12}{'all-reduces/step':>18}" + "".join(
        f"{f'{p} ranks (ms)':>15}{'vs torch':>10}" for p in args.ranks)
    print(head)
    print("-" * len(head))
    for name in VARIANTS:
        n = buckets.get(name)
        row = f"{name:<12}{'?' if n is None else str(n):>18}"
        for p in args.ranks:
            t, ref = table[p][name], table[p]["torch DDP"]
            row += f"{t * 1e3:>15.1f}{t / ref:>10.2f}"
        print(row)
    print("(torch DDP's all-reduces run in C++, out of the recorder's sight: '?')")
    if args.out:
        with open(args.out, "w", newline="") as f:
            out = csv.writer(f)
            out.writerow(["variant", "all-reduces/step"] + [f"{p} ranks (ms)" for p in args.ranks]
                         + [f"{p} ranks vs torch" for p in args.ranks])
            for name in VARIANTS:
                out.writerow([name, buckets.get(name)]
                             + [round(table[p][name] * 1e3, 3) for p in args.ranks]
                             + [round(table[p][name] / table[p]["torch DDP"], 3)
                                for p in args.ranks])


if __name__ == "__main__":
    main()
