"""Training-step time of the from-scratch FSDP against torch's FSDP2 (`fully_shard`).

One run, printed side by side: for 2 and 4 ranks, the time of one step (zero_grad, forward,
backward with the gradient reduce-scatter, Adam step on the shards) with

    torch FSDP2      torch.distributed.fsdp.fully_shard on each Linear and on the root, over a
                     device mesh of the ranks' device (init_device_mesh("cpu", (p,)) here);
                     DTensor shards along dim 0
    ours             toolkit FullyShardedDataParallel: each Linear a unit, flat padded shards
    ours + prefetch  the same with prefetch=True (the next unit's all-gather issued async)

on the same model (a TinyMLP of a few million parameters, so that the all-gathers and
reduce-scatters are a sizeable part of the step) and the same data. A step's time is the
slowest rank's (each step starts after a barrier); the table shows the median over steps, with
the variants taking turns step by step so that a busy moment of the machine does not fall on
one variant only. "vs FSDP2" is the ratio to torch FSDP2. The last column, the loss after the
run, shows that every variant trained the same model the same way (equal up to rounding).

Usage: python benchmarks/fsdp_step.py [--ranks 2 4] [--steps 20] [--width 1024]
                                      [--backend auto|gloo|nccl] [--device auto|cpu|cuda]
                                      [--out fsdp_step.csv]
Times vary ±30 % on a shared 2-core machine: read the ratios, and run it twice. On a GPU node
(``--backend auto`` picks NCCL with a GPU per rank) model and data live on each rank's GPU and
every step is timed to the end of its kernels; ``--out`` writes the table as CSV.
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

from toolkit.data_parallel.fsdp import FullyShardedDataParallel
from toolkit.launch import context, device, spawn
from toolkit.models import TinyMLP, count_parameters

sys.path.insert(0, str(Path(__file__).resolve().parent))
import saved  # noqa: E402  (benchmarks/saved.py)

VARIANTS = ("torch FSDP2", "ours", "ours + prefetch")
ABOUT = ("One training step of torch's FSDP2 and the toolkit's FSDP (with and without "
         "prefetch) on p ranks, seconds (median over steps of the slowest rank), the ratio to "
         "FSDP2 and each variant's loss after the run. benchmarks/fsdp_step.py --save.")


def _model(args: argparse.Namespace) -> TinyMLP:
    return TinyMLP(d_in=args.width // 4, d_hidden=args.width, d_out=args.width // 4,
                   depth=args.depth, seed=0)


def _wrap(name: str, model: TinyMLP) -> torch.nn.Module:
    if name == "torch FSDP2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device().type, (dist.get_world_size(),))
        for layer in model.layers:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        return fully_shard(model, mesh=mesh)
    return FullyShardedDataParallel(model, prefetch=name == "ours + prefetch")


def _steps(model: torch.nn.Module, opt: torch.optim.Optimizer, x, y,
           n: int) -> tuple[list[float], float]:
    times, loss = [], float("nan")
    # CUDA kernels run asynchronously: time a step to the end of its last kernel.
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    for _ in range(n):
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        opt.zero_grad()
        out = F.mse_loss(model(x), y)
        out.backward()
        opt.step()
        sync()
        times.append(time.perf_counter() - t0)
        loss = out.item()
    return times, loss


def _bench(rank: int, world_size: int, args: argparse.Namespace) -> dict:
    torch.set_num_threads(1)  # one core per rank: the ranks share the machine's cores
    dev = device()  # cpu on gloo, this rank's GPU on NCCL
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch, args.width // 4, generator=gen).to(dev)
    y = torch.randn(args.batch, args.width // 4, generator=gen).to(dev)
    runs = {}
    for name in VARIANTS:
        model = _wrap(name, _model(args).to(dev))
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        _steps(model, opt, x, y, 2)  # warm-up
        runs[name] = (model, opt)
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    losses: dict[str, float] = {}
    for r in range(args.steps):
        order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]
        for name in order:
            t, losses[name] = _steps(*runs[name], x, y, 1)
            times[name] += t
    return {"times": times, "losses": losses, "where": f"{context().backend}, {dev}"
            + (" (ranks share the GPUs)" if context().placement == "shared" else "")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per variant")
    parser.add_argument("--width", type=int, default=1024, help="hidden width of the TinyMLP")
    parser.add_argument("--depth", type=int, default=3, help="hidden layers of the TinyMLP")
    parser.add_argument("--batch", type=int, default=32, help="items per rank per step")
    parser.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"],
                        help="auto: NCCL when there is a GPU per rank, else gloo")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"],
                        help="cuda: the GPUs there are, shared by the ranks when fewer (gloo); "
                        "default: $TOOLKIT_DEVICE, else auto")
    parser.add_argument("--out", help="also write the table to this CSV file")
    saved.add_arguments(parser, "fsdp_step")
    args = parser.parse_args(argv)
    if min(args.ranks) < 1 or args.steps < 1 or args.width < 4 or args.depth < 1:
        parser.error("--ranks and --steps must be >= 1, --width >= 4, --depth >= 1")
    save_to = saved.target(parser, args, "fsdp_step")

    n_params = count_parameters(_model(args))
    print(f"model: TinyMLP width {args.width}, depth {args.depth}: {n_params:,} parameters "
          f"({n_params * 4 / 2**20:.1f} MiB fp32), {args.depth + 1} Linear units; batch "
          f"{args.batch} per rank; Adam; torch {torch.__version__}", flush=True)
    table: dict[int, dict[str, float]] = {}
    losses: dict[int, dict[str, float]] = {}
    for p in args.ranks:
        load_before = saved.load_average()
        results = spawn(_bench, p, args, backend=args.backend, device=args.device, timeout=600,
                        echo=False)
        print(f"{p} ranks on {results[0]['where']} (rank 0)", flush=True)
        table[p] = {name: statistics.median(max(step) for step in
                                            zip(*(r["times"][name] for r in results)))
                    for name in VARIANTS}
        losses[p] = results[0]["losses"]
        saved.record(save_to, "fsdp_step", f"{p} ranks", {
            "ranks": p, "where": results[0]["where"], "parameters": n_params,
            "steps": args.steps, "step_s": table[p],
            "vs_fsdp2": {name: table[p][name] / table[p]["torch FSDP2"] for name in VARIANTS},
            "loss": losses[p]}, about=ABOUT, load_before=load_before, argv=argv)

    head = f"{'variant':<17}" + "".join(f"{f'{p} ranks (ms)':>15}{'vs FSDP2':>10}{'loss':>11}"
                                        for p in args.ranks)
    print(head)
    print("-" * len(head))
    for name in VARIANTS:
        row = f"{name:<17}"
        for p in args.ranks:
            t, ref = table[p][name], table[p]["torch FSDP2"]
            row += f"{t * 1e3:>15.1f}{t / ref:>10.2f}{losses[p][name]:>11.6f}"
        print(row)
    if args.out:
        with open(args.out, "w", newline="") as f:
            out = csv.writer(f)
            out.writerow(["variant"] + [f"{p} ranks {what}" for p in args.ranks
                                        for what in ("(ms)", "vs FSDP2", "loss")])
            for name in VARIANTS:
                out.writerow([name] + [v for p in args.ranks for v in (
                    round(table[p][name] * 1e3, 3),
                    round(table[p][name] / table[p]["torch FSDP2"], 3), losses[p][name])])


if __name__ == "__main__":
    main()
