"""The planner against a real run: TinyGPT steps on CPU ranks under a layout, and the laptop's
own FLOP/s and α-β, so that `predict` can be set beside a measurement.

    link = link_fit(world_sizes=(2, 4)).link          # gloo all-reduce, α and β of this machine
    peak = concurrent_flops(cfg, tokens=256, ranks=4)  # FLOP/s one rank gets while all compute
    here = laptop(link=link, peak_flops=peak)          # toolkit.planner.laptop
    run = run_layout(cfg, Layout(dp=2, tp=2), global_batch=16)   # 4 gloo ranks
    run["step"], predict(cfg, here, Layout(dp=2, tp=2), global_batch=16, ...).step

A run builds the same TinyGPT on every rank (seeded), swaps each block's attention and MLP for
`toolkit.tensor_parallel`'s `ParallelSelfAttention` / `ParallelMLP` over the rank's tp group
(Megatron's f and g: 2 all-reduces forward, 2 backward per layer), feeds each data-parallel
replica its B/dp sequences in m micro-batches, and all-reduces the flattened gradients over the
dp group once per step (one bucket: the α-β model's single all-reduce), then steps SGD.
Groups come from `Layout.groups`, so the ranks sit where the planner assumes. Only pp = cp = 1
and ZeRO stage 0 run here (pipeline runs live in `toolkit.pipeline.run_pipeline`).
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..cost import Fit, fit_alpha_beta
from ..launch import device, spawn
from ..models import GPTConfig, TinyGPT, make_token_data
from ..planner.layout import Layout
from ..tensor_parallel import ParallelMLP, ParallelSelfAttention
from .collectives import measure as measure_collectives

__all__ = ["concurrent_flops", "link_fit", "run_layout"]


def link_fit(*, world_sizes=(2, 4), sizes=(1 << 12, 1 << 16, 1 << 20, 1 << 22),
             repeats: int = 3, timeout: float = 120) -> Fit:
    """α and β of torch's gloo all-reduce on this machine: a small
    `toolkit.experiments.collectives.measure` sweep, fitted with the ring's coefficients
    (gloo's CPU all-reduce is ring-based, and the planner models every all-reduce as a ring)."""
    table = measure_collectives([("all_reduce", "torch")], sizes=list(sizes),
                                world_sizes=list(world_sizes), repeats=repeats, warmup=1,
                                timeout=timeout)
    return fit_alpha_beta(table.assign(algorithm="ring"))


def _matmul_rate(rank: int, world_size: int, rows: int, inner: int, outer: int,
                 seconds: float) -> float:
    dev = device()
    a, w = torch.randn(rows, inner, device=dev), torch.randn(inner, outer, device=dev)
    a @ w  # first call allocates
    dist.barrier()  # every rank computes at once, as in a training step
    calls, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ w  # (rows, inner) @ (inner, outer)
        calls += 1
    if dev.type == "cuda":
        torch.cuda.synchronize()  # the launched kernels have all run before the clock stops
    return 2 * rows * inner * outer * calls / (time.perf_counter() - t0)


def concurrent_flops(cfg: GPTConfig, *, tokens: int, ranks: int = 4, seconds: float = 0.3,
                     timeout: float = 60) -> float:
    """FLOP/s one rank sustains on the model's biggest matmul, (tokens, h) @ (h, 4h), while all
    `ranks` run it at once for `seconds` (median over ranks): the laptop's "peak" for the
    planner. A rank's share of 2 busy cores, not a datasheet figure."""
    rates = spawn(_matmul_rate, ranks, tokens, cfg.d_model, cfg.ff_dim, seconds,
                  echo=False, timeout=timeout)
    return float(statistics.median(rates))


def _my_groups(rank: int, layout: Layout) -> dict[str, object]:
    mine = {}
    for axis in ("tp", "dp"):
        for ranks in layout.groups(axis):  # every rank creates every group, in the same order
            group = dist.new_group(ranks)
            if rank in ranks:
                mine[axis] = group
    return mine


def _train_rank(rank: int, world_size: int, model: TinyGPT, layout: Layout, global_batch: int,
                steps: int, warmup: int) -> dict:
    layout.check(world_size)
    groups = _my_groups(rank, layout)
    cfg, dev = model.cfg, device()
    model.to(dev)  # built once by the caller, on the CPU
    if layout.tp > 1:
        for block in model.blocks:
            block.attn = ParallelSelfAttention.from_dense(block.attn, group=groups["tp"])
            block.mlp = ParallelMLP.from_dense(block.mlp, group=groups["tp"])
    x, y = make_token_data(global_batch, cfg.seq_len, cfg.vocab_size, device=dev)
    b = global_batch // layout.dp
    i = layout.coords(rank)["dp"]
    micro = list(zip(x[i * b:(i + 1) * b].chunk(layout.micro_batches),
                     y[i * b:(i + 1) * b].chunk(layout.micro_batches)))
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.01)

    def step() -> tuple[float, float]:
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for xs, ys in micro:
            logits, _ = model(xs)  # (b/m, s, V)
            loss = F.cross_entropy(logits.flatten(0, 1), ys.flatten()) / len(micro)
            loss.backward()
            total += loss.item()
        t0 = time.perf_counter()
        if layout.dp > 1:  # one flat bucket, averaged over the replicas
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            dist.all_reduce(flat, group=groups["dp"])
            flat /= layout.dp
            offset = 0
            for p in params:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        comm = time.perf_counter() - t0
        opt.step()
        return total, comm

    first_loss = step()[0]
    for _ in range(warmup - 1):
        step()
    times, comms = [], []
    for _ in range(steps):
        dist.barrier()
        t0 = time.perf_counter()
        _, comm = step()
        times.append(time.perf_counter() - t0)
        comms.append(comm)
    dist.barrier()  # no rank exits while a peer may still talk to it
    return {"first_loss": first_loss, "times": times, "dp_comm": comms}


def run_layout(cfg: GPTConfig, layout: Layout, *, global_batch: int, steps: int = 3,
               warmup: int = 1, timeout: float = 120) -> dict[str, float]:
    """Train `cfg` for `warmup` + `steps` steps on layout.world_size gloo ranks (module
    docstring). Returns ``step`` (seconds: per step the slowest rank, median over steps),
    ``dp_comm`` (seconds in the gradient all-reduce: per step the *fastest* rank's, the one that
    arrived last and so waited for no one, median over steps) and ``first_loss`` (the loss of
    the first step averaged over dp replicas: equal for every layout of one model)."""
    if layout.pp != 1 or layout.cp != 1 or layout.zero != 0:
        raise ValueError(f"run_layout runs dp × tp with ZeRO 0 only, got {layout.label()}")
    if global_batch % (layout.dp * layout.micro_batches):
        raise ValueError(f"run_layout: global_batch={global_batch} must split into dp × m = "
                         f"{layout.dp} × {layout.micro_batches} micro-batches")
    if steps < 1 or warmup < 1:
        raise ValueError(f"run_layout: need steps >= 1 and warmup >= 1, got {steps}, {warmup}")
    # Built here, once: a first TinyGPT costs ~2 s of lazy imports, paid by every forked rank
    # at once otherwise; each rank gets its own copy of the built model.
    out = spawn(_train_rank, layout.world_size, TinyGPT(cfg), layout, global_batch, steps, warmup,
                echo=False, timeout=timeout)
    slowest = [max(r["times"][k] for r in out) for k in range(steps)]
    # A rank that finishes backward early waits inside the all-reduce for the others; the
    # last to arrive measures the collective itself.
    comm = [min(r["dp_comm"][k] for r in out) for k in range(steps)]
    heads = [out[layout.rank(dp=i)]["first_loss"] for i in range(layout.dp)]
    return {"step": statistics.median(slowest), "dp_comm": statistics.median(comm),
            "first_loss": sum(heads) / len(heads)}
