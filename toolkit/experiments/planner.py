"""The planner against a real run: TinyGPT steps on CPU ranks under dp × tp layouts, and this
machine's own rates measured on the same ranks, so that a prediction can be set beside a
measurement.

    cal, runs = calibrate(cfg, [Layout(dp=4), Layout(dp=2, tp=2)], global_batch=16)
    predict_calibrated(cfg, Layout(dp=2, tp=2), cal, global_batch=16).step, runs.core
    run = run_layout(cfg, Layout(dp=2, tp=2), global_batch=16)     # one layout, wall time

A run builds the same TinyGPT on every rank (seeded), swaps each block's attention and MLP for
`toolkit.tensor_parallel`'s `ParallelSelfAttention` / `ParallelMLP` over the rank's tp group
(Megatron's f and g: 2 all-reduces forward, 2 backward per layer), feeds each data-parallel
replica its B/dp sequences in m micro-batches, and all-reduces the flattened gradients over the
dp group once per step (one bucket: the α-β model's single all-reduce), then steps SGD.
Groups come from `Layout.groups`, so the ranks sit where the planner assumes. Only pp = cp = 1
and ZeRO stage 0 run here (pipeline runs live in `toolkit.pipeline.run_pipeline`).

`calibrate` measures in two launches of the same ranks (one holding both would hold twice the
memory), each in rounds, each round in a rotated order so that a busy second of the machine
falls on every part alike: first every op of `toolkit.planner.calibrated`'s table at the sizes
the layouts use (`planner_ops.op_bench`, all ranks at once, operands taken from a pool larger
than the caches, `COLD_BYTES`), one sequence's whole forward + backward against its ops (the
glue) and the all-reduce of every group size at the sizes the layouts send; then `steps`
training steps of every layout, timed in core time (`time.process_time`) and on the clock.
Medians over ranks and rounds make the `Calibration` and the table of measured steps. Core
time is what a rank spends whatever else the machine runs, so rates and steps measured a few
seconds apart compare.
"""

from __future__ import annotations

import copy
import statistics
import time
from typing import Callable, NamedTuple, Sequence

import pandas as pd
import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..cost import Sample, fit_alpha_beta
from ..launch import device, spawn
from ..models import GPTConfig, TinyGPT, make_token_data
from ..planner.calibrated import (
    Calibration, Op, dense_ops, local_params, op_work, step_ops, tp_messages,
)
from ..planner.layout import Layout
from ..tensor_parallel import ParallelMLP, ParallelSelfAttention
from .planner_ops import (
    OperandPool, all_reduce_cpu, average_gradients, model_bench, op_bench, stand_ins,
    time_all_reduce, time_op,
)

__all__ = ["calibrate", "run_layout"]

PER_PARAMETER = ("accumulate", "optimizer", "flatten")  # ops whose bench needs the rank's params
COLD_BYTES = 8 << 20
"""Bytes of each rank's operand pool: with 4 ranks, as much as this machine's caches hold (2 × 2
MiB L2, 32 MiB L3 shared), so that large operands come mostly from memory, as in a step (module
docstring), while the launch stays small."""


def _check(layout: Layout, global_batch: int) -> None:
    if layout.pp != 1 or layout.cp != 1 or layout.zero != 0:
        raise ValueError(f"run_layout runs dp × tp with ZeRO 0 only, got {layout.label()}")
    if global_batch % (layout.dp * layout.micro_batches):
        raise ValueError(f"run_layout: global_batch={global_batch} must split into dp × m = "
                         f"{layout.dp} × {layout.micro_batches} micro-batches")


def _new_group(ranks: list[int], made: dict[tuple[int, ...], object]) -> object:
    """`dist.new_group(ranks)`, once per set of ranks (`made` keeps those already made): every
    rank must call it for every group, in the same order, member or not."""
    key = tuple(ranks)
    if key not in made:
        made[key] = dist.new_group(ranks)
    return made[key]


def _my_groups(rank: int, layout: Layout, made: dict[tuple[int, ...], object] | None = None
               ) -> dict[str, object]:
    """This rank's tp and dp groups (axes of size 1 have none), from `Layout.groups`."""
    made = {} if made is None else made
    mine = {}
    for axis in ("tp", "dp"):
        for ranks in layout.groups(axis):
            if len(ranks) > 1:
                group = _new_group(ranks, made)
                if rank in ranks:
                    mine[axis] = group
    return mine


class _Run(NamedTuple):
    """One layout on one rank: ``step()`` trains a step and returns (loss, seconds in the
    gradient exchange); and the rank's parameters."""

    step: Callable[[], tuple[float, float]]
    params: list[torch.nn.Parameter]


def _layout_step(rank: int, model: TinyGPT, layout: Layout, global_batch: int, *,
                 made: dict[tuple[int, ...], object] | None = None) -> _Run:
    """This rank's training step under `layout` (module docstring). `made`: groups already
    made, shared between layouts."""
    groups = _my_groups(rank, layout, made)
    cfg, dev = model.cfg, device()
    model.to(dev)
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
            average_gradients(params, groups["dp"], layout.dp)
        comm = time.perf_counter() - t0
        opt.step()
        return total, comm

    return _Run(step, params)


def _train_rank(rank: int, world_size: int, model: TinyGPT, layout: Layout, global_batch: int,
                steps: int, warmup: int) -> dict:
    layout.check(world_size)
    step = _layout_step(rank, model, layout, global_batch).step
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
    _check(layout, global_batch)
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


def _links_wanted(cfg: GPTConfig, layouts: Sequence[Layout], global_batch: int
                  ) -> dict[int, list[int]]:
    """Group size → message sizes (bytes) the layouts all-reduce over groups of that size, with
    16 KiB added so that every fit sees two sizes (α apart from β)."""
    sizes: dict[int, set[int]] = {}
    for d in layouts:
        count, nbytes = tp_messages(cfg, d, global_batch=global_batch)
        if count:
            sizes.setdefault(d.tp, set()).add(int(nbytes))
        if d.dp > 1:
            sizes.setdefault(d.dp, set()).add(4 * local_params(cfg, d.tp))
    return {p: sorted(s | {16 << 10}) for p, s in sorted(sizes.items())}


def _bench_rank(rank: int, world_size: int, model: TinyGPT, layouts: list[Layout],
                global_batch: int, ops: list[Op], links: dict[int, list[int]], rounds: int,
                trials: int, cold_bytes: int) -> dict:
    """Every op alone at its size, one sequence whole (the glue) and the all-reduces, in rounds.
    The steps run in a launch of their own (`_steps_rank`): one launch holding both would hold
    twice the memory."""
    dev, cfg = device(), model.cfg
    made: dict[tuple[int, ...], object] = {}
    shards = {}  # one layout per tp degree: its parameters' shapes are what the benches need
    for d in layouts:
        if d.tp not in shards:
            shards[d.tp] = _layout_step(rank, copy.deepcopy(model), d, global_batch,
                                        made=made).params
    by_count = {sum(p.numel() for p in params): stand_ins(params) for params in shards.values()}
    del shards
    pool = OperandPool(cold_bytes, device=dev) if cold_bytes else None
    benches = {op: op_bench(op, cfg, pool=pool, device=dev, params=by_count.get(op.shape[0])
                            if op.kind in PER_PARAMETER else None) for op in ops}
    # The glue: one sequence whole against its ops, both with their operands in cache.
    whole = model_bench(copy.deepcopy(model).to(dev), cfg.seq_len, device=dev)
    hot = {op: op_bench(op, cfg, device=dev) for op in dense_ops(cfg, cfg.seq_len)}
    groups = {}
    for p in links:  # every rank in one group of p, as a layout's tp (or dp) groups place them
        for ranks in Layout(dp=world_size // p, tp=p).groups("tp"):
            group = _new_group(ranks, made)
            if rank in ranks:
                groups[p] = group
    out = {"ops": {op: [] for op in ops}, "whole": [], "hot": {op: [] for op in hot},
           "links": {(p, n): [] for p, ns in links.items() for n in ns}}
    benched = [(out["ops"][op], benches[op]) for op in ops] + [(out["whole"], whole)] + \
              [(out["hot"][op], fn) for op, fn in hot.items()]
    for r in range(rounds):  # each round in a rotated order
        turn = r % len(benched)
        for record, fn in benched[turn:] + benched[:turn]:
            dist.barrier()  # every rank runs the same op at the same time
            record.append(time_op(fn, trials=trials, device=dev))
        for (p, n), record in out["links"].items():
            record.append(time_all_reduce(n, groups[p], device=dev))
    dist.barrier()  # no rank exits while a peer may still talk to it
    return out


def _steps_rank(rank: int, world_size: int, model: TinyGPT, layouts: list[Layout],
                global_batch: int, rounds: int, steps: int) -> dict:
    """`steps` steps of every layout per round, the layouts in a rotated order each round."""
    made: dict[tuple[int, ...], object] = {}
    runs = [_layout_step(rank, copy.deepcopy(model), d, global_batch, made=made)
            for d in layouts]
    out: dict[str, list] = {"first_loss": [], "steps": [[] for _ in layouts]}
    for run in runs:  # a warm-up; the first step's loss, the same for every layout
        out["first_loss"].append(run.step()[0])
        for p in run.params:
            p.grad = None
    for r in range(rounds):
        turn = r % len(layouts)
        for k in list(range(turn, len(layouts))) + list(range(turn)):
            for _ in range(steps):
                dist.barrier()
                with all_reduce_cpu() as comm:
                    w, c = time.perf_counter(), time.process_time()
                    runs[k].step()
                    c, w = time.process_time() - c, time.perf_counter() - w
                out["steps"][k].append((c, w, sum(comm)))
                for p in runs[k].params:  # a step frees them first anyway; free them now, so
                    p.grad = None         # that five layouts do not hold five sets at once
    dist.barrier()
    return out


def _median_over(out: list[dict], pick: Callable[[dict], list], i: int) -> float:
    """Median over ranks of each rank's median over its samples (element i of each sample)."""
    return statistics.median(statistics.median(s[i] for s in pick(r)) for r in out)


def _over_steps(out: list[dict], k: int, i: int, across: Callable) -> float:
    """Layout k's steps: `across` the ranks (median of core times; max of wall times, a step
    ends when its last rank does), then the median over steps."""
    steps = zip(*(r["steps"][k] for r in out))  # step by step, one sample per rank
    return statistics.median(across(sample[i] for sample in step) for step in steps)


def calibrate(cfg: GPTConfig, layouts: Sequence[Layout], *, global_batch: int,
              rounds: int = 2, steps: int = 2, trials: int = 3, cold_bytes: int = COLD_BYTES,
              timeout: float = 180) -> tuple[Calibration, pd.DataFrame]:
    """Measure this machine's rates and the layouts' steps on the same ranks, interleaved
    (module docstring). `cold_bytes`: each rank's `OperandPool`, from which the ops take their
    operands out of cache (0: every op reuses one set, in cache). Returns the `Calibration` and
    one row per layout (index: its label):

    * ``core``: CPU seconds a rank spends per step (median over ranks, then over steps), what
      `predict_calibrated` predicts; ``comm_core``: the part of it inside `dist.all_reduce`;
    * ``wall``: per step the slowest rank's clock time, median over steps; ``contention``:
      wall / core;
    * ``first_loss``: the first step's loss averaged over the dp replicas (equal for every
      layout of one model); ``layout``: the `Layout`.
    """
    layouts = list(layouts)
    if not layouts:
        raise ValueError("calibrate: layouts is empty; pass at least one Layout")
    world = layouts[0].world_size
    for d in layouts:
        _check(d, global_batch)
        d.check(world)
    if min(rounds, steps, trials) < 1:
        raise ValueError(f"calibrate: rounds, steps and trials must be >= 1, got {rounds}, "
                         f"{steps}, {trials}")
    ops = sorted({op for d in layouts for op in step_ops(cfg, d, global_batch=global_batch)})
    links = _links_wanted(cfg, layouts, global_batch)
    # Built here, once (as in run_layout); each rank gets its own copy.
    model = TinyGPT(cfg)
    out = spawn(_bench_rank, world, model, layouts, global_batch, ops, links, rounds, trials,
                cold_bytes, echo=False, timeout=timeout)
    ran = spawn(_steps_rank, world, model, layouts, global_batch, rounds, steps, echo=False,
                timeout=timeout)
    core = {op: _median_over(out, lambda r, op=op: r["ops"][op], 0) for op in ops}
    # One sequence's forward + backward, whole, less its ops timed alone (in cache, both).
    glue = max(0.0, _median_over(out, lambda r: r["whole"], 0)
               - sum(n * _median_over(out, lambda r, op=op: r["hot"][op], 0)
                     for op, n in dense_ops(cfg, cfg.seq_len).items()))
    samples = [Sample("all_reduce", "ring", p, n, _median_over(out, lambda r, k=(p, n):
                                                                r["links"][k], 0))
               for p, n in out[0]["links"]]
    spreads = {}
    for op in ops:  # every rank's every round: how far one measurement of a rate may land
        every = [s[0] for r in out for s in r["ops"][op]]
        q = statistics.quantiles(every, n=4) if len(every) > 1 else [every[0]] * 3
        spreads[op] = (q[2] - q[0]) / 2 / statistics.median(every)
    calibration = Calibration(
        rates={op: op_work(op) / core[op] for op in ops}, glue=glue, spread=spreads,
        links={p: fit_alpha_beta([s for s in samples if s.p == p]).link for p in links},
        source=f"measured on {world} ranks: {rounds} rounds, median of ranks, core time")
    rows = {}
    for k, d in enumerate(layouts):
        heads = [ran[d.rank(dp=i)]["first_loss"][k] for i in range(d.dp)]
        rows[d.label()] = {"core": _over_steps(ran, k, 0, statistics.median),
                           "comm_core": _over_steps(ran, k, 2, statistics.median),
                           "wall": _over_steps(ran, k, 1, max),
                           "first_loss": sum(heads) / len(heads), "layout": d}
    table = pd.DataFrame(rows).T.infer_objects()
    table.insert(3, "contention", table.wall / table.core)
    return calibration, table
