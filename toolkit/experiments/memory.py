"""Real sharded runs on ranks, measured against the memory math: what lesson 07 draws and
`benchmarks/memory_measured.py` prints.

Each method trains a TinyGPT for a few steps of Adam on every rank (its slice of the batch), in
fp32 (lesson 07) or in mixed precision (``precision="mixed"``, lesson 05), then counts the bytes
of parameters, gradients and optimizer state the rank holds (`held_model_states`) and the
collectives it called (`toolkit.comm`):

    ddp          replicated model, gradients all-reduced parameter by parameter   (stage 0)
    zero1        `ShardedOptimizer(stage=1)`                                      (stage 1)
    zero2        `ShardedOptimizer(stage=2)`                                      (stage 2)
    fsdp         `FullyShardedDataParallel`, each block a unit                    (stage 3)
    torch_fsdp2  torch's `fully_shard` on the ranks' device mesh; per-parameter (dim-0) shards in
                 DTensors, collectives `all_gather_single` / `reduce_scatter_single` (stage 3)

Mixed precision: bf16 working parameters and gradients, fp32 masters in the optimizer
(`toolkit.precision.MasterWeightOptimizer`), so ddp, zero1, zero2 and fsdp (bf16 shards, DeepSpeed
ZeRO-3's layout) hold ZeRO's 2 + 2 + 12 bytes per parameter; ``fsdp_fp32_shards`` (our FSDP with
``compute_dtype=bf16``, reduce in fp32) and ``torch_fsdp2`` (``MixedPrecisionPolicy(bf16,
fp32)``) keep fp32 shards that are the masters: 4 + 4 + 8, the same 16Ψ/N_d split otherwise.

Predictions (`predicted_rows`): the paper's exact Ψ/N_d, and what each implementation stores:
flat groups padded to a multiple of N_d (`model_state_bytes(..., padded=True)` summed over
groups) for ours, per-parameter dim-0 chunks for FSDP2 (`dim0_shard_numel`). Wire bytes per
rank per step come from the recorded collectives, counted as a ring moves them
(`toolkit.cost.bytes_sent_per_rank`).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import pandas as pd
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from .. import comm
from ..cost import bytes_sent_per_rank
from ..data_parallel.fsdp import FullyShardedDataParallel
from ..data_parallel.zero import ShardedOptimizer
from ..launch import device, spawn
from ..memory.measured import held_model_states
from ..memory.states import FP32_ADAM, MIXED_ADAM, model_state_bytes
from ..models import GPTConfig, TinyGPT, count_parameters, make_token_data
from ..precision.master import MasterWeightOptimizer, master_weights

METHODS = ("ddp", "zero1", "zero2", "fsdp", "torch_fsdp2")
"""Every method `run_methods` knows in fp32, in stage order."""
MIXED_METHODS = ("ddp", "zero1", "zero2", "fsdp", "fsdp_fp32_shards", "torch_fsdp2")
"""Every method `run_methods` knows with ``precision="mixed"``, in stage order."""
PRECISIONS = ("fp32", "mixed")
"""fp32 Adam (4 + 4 + 8 bytes per parameter), or mixed-precision Adam (2 + 2 + 12)."""
FP32_SHARDS = ("fsdp_fp32_shards", "torch_fsdp2")
"""Mixed-precision methods whose fp32 shards are the master weights: 4 + 4 + 8 per parameter."""
STAGE = {"ddp": 0, "zero1": 1, "zero2": 2, "fsdp": 3, "fsdp_fp32_shards": 3, "torch_fsdp2": 3}
"""The ZeRO stage each method implements."""
DEFAULT_CONFIG = GPTConfig(vocab_size=101, seq_len=16, d_model=63, n_head=7, n_layer=4)
"""A TinyGPT of 201,285 parameters (odd, so flat shards at 2 and 4 ranks need padding):
3.2 MB of fp32 Adam states, about a second per method on a CPU."""
_RING = {"all_reduce": "all_reduce", "reduce_scatter_tensor": "reduce_scatter",
         "reduce_scatter_single": "reduce_scatter", "all_gather_into_tensor": "all_gather",
         "all_gather_single": "all_gather"}  # recorded op -> the collective a ring runs


def _build(method: str, cfg: GPTConfig, lr: float,
           precision: str = "fp32") -> tuple[Any, torch.optim.Optimizer, list]:
    """(model to call, optimizer, flat group sizes) for one method on this rank."""
    if precision == "mixed":
        return _build_mixed(method, cfg, lr)
    model = TinyGPT(cfg, device=device())
    if method == "ddp":
        return model, torch.optim.Adam(model.parameters(), lr=lr), []
    if method in ("zero1", "zero2"):
        opt = ShardedOptimizer(model.parameters(), torch.optim.Adam, stage=STAGE[method], lr=lr)
        return model, opt, [f.numel for f in opt.flats]
    if method == "fsdp":
        fsdp = FullyShardedDataParallel(model)
        return fsdp, torch.optim.Adam(fsdp.parameters(), lr=lr), [
            g.numel for g in fsdp._all_groups()]
    if method == "torch_fsdp2":
        mesh = init_device_mesh(device().type, (dist.get_world_size(),))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model, torch.optim.Adam(model.parameters(), lr=lr), []
    raise ValueError(f"unknown method {method!r}; choose from {METHODS}")


def _build_mixed(method: str, cfg: GPTConfig,
                 lr: float) -> tuple[Any, torch.optim.Optimizer, list]:
    """`_build` in mixed precision: bf16 working copies, fp32 masters (module docstring)."""
    bf16 = torch.bfloat16
    if method in ("ddp", "zero1", "zero2"):
        model = TinyGPT(cfg, device=device()).to(bf16)
        if method == "ddp":
            return model, MasterWeightOptimizer(model.parameters(), torch.optim.Adam, lr=lr), []
        opt = ShardedOptimizer(model.parameters(), master_weights(torch.optim.Adam),
                               stage=STAGE[method], lr=lr)
        return model, opt, [f.numel for f in opt.flats]
    if method in ("fsdp", "fsdp_fp32_shards"):
        if method == "fsdp":  # bf16 shards, fp32 masters in the optimizer: 2 + 2 + 12
            fsdp = FullyShardedDataParallel(TinyGPT(cfg, device=device()), shard_dtype=bf16)
            opt = MasterWeightOptimizer(fsdp.parameters(), torch.optim.Adam, lr=lr)
        else:  # fp32 shards are the masters, gathered in bf16, reduced in fp32: 4 + 4 + 8
            fsdp = FullyShardedDataParallel(TinyGPT(cfg, device=device()), compute_dtype=bf16)
            opt = torch.optim.Adam(fsdp.parameters(), lr=lr)
        return fsdp, opt, [g.numel for g in fsdp._all_groups()]
    if method == "torch_fsdp2":
        model = TinyGPT(cfg, device=device())
        mesh = init_device_mesh(device().type, (dist.get_world_size(),))
        policy = MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=torch.float32)
        for block in model.blocks:
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        return model, torch.optim.Adam(model.parameters(), lr=lr), []
    raise ValueError(f"unknown method {method!r}; choose from {MIXED_METHODS}")


def _rank_run(rank: int, world_size: int, methods: Sequence[str], cfg: GPTConfig, steps: int,
              batch: int, lr: float, precision: str = "fp32") -> list[dict]:
    x, y = make_token_data(batch, cfg.seq_len, cfg.vocab_size, device=device())
    n = batch // world_size
    xs, ys = x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]
    out = []
    for method in methods:
        model, opt, groups = _build(method, cfg, lr, precision)
        with comm.recording() as trace:
            for _ in range(steps):
                opt.zero_grad()
                loss = model(xs, ys)[1]
                loss.backward()
                if method == "ddp":
                    for p in model.parameters():
                        dist.all_reduce(p.grad)
                        p.grad.div_(world_size)
                opt.step()
        held = held_model_states(model, opt)
        wire = sum(_ring_bytes(e.op, e.nbytes, world_size) for e in trace.events) / steps
        out.append(dict(method=method, rank=rank, params=held.params, grads=held.grads,
                        optimizer=held.optimizer, step_bytes=held.step_bytes,
                        groups=groups, wire_bytes=wire if trace.events else float("nan"),
                        calls=len(trace.events) // steps, loss=float(loss)))
    return out


def _ring_bytes(op: str, nbytes: int, p: int) -> float:
    """Bytes one rank sends for a recorded collective, as a ring moves it. The recorder
    counts the input: a shard for all-gather (the full tensor is p times it)."""
    if op not in _RING:
        return 0.0
    full = nbytes * p if _RING[op] == "all_gather" else nbytes
    return bytes_sent_per_rank(_RING[op], "ring", full, p)


def run_methods(world_size: int, methods: Sequence[str] | None = None, *,
                cfg: GPTConfig = DEFAULT_CONFIG, steps: int = 2, batch: int = 8,
                lr: float = 1e-3, precision: str = "fp32", timeout: float = 120):
    """Train with every method (default: all of `precision`'s) on `world_size` real ranks;
    one row per (method, rank) of measured bytes (params, grads, optimizer, step_bytes), flat
    group sizes, wire bytes per step and collective calls per step. A pandas DataFrame."""
    if precision not in PRECISIONS:
        raise ValueError(f"run_methods: precision must be one of {PRECISIONS}, got "
                         f"{precision!r}")
    known = METHODS if precision == "fp32" else MIXED_METHODS
    methods = known if methods is None else methods
    unknown = set(methods) - set(known)
    if unknown:
        raise ValueError(f"run_methods: unknown methods {sorted(unknown)} for precision "
                         f"{precision!r}; choose from {known}")
    if batch % world_size:
        raise ValueError(f"run_methods: batch must be divisible by world_size, got {batch} "
                         f"and {world_size}")
    rows = spawn(_rank_run, world_size, list(methods), cfg, steps, batch, lr, precision,
                 timeout=timeout, echo=False)
    frame = pd.DataFrame([row for rank_rows in rows for row in rank_rows])
    frame.insert(1, "world_size", world_size)
    frame.insert(2, "stage", frame.method.map(STAGE))
    frame.insert(3, "precision", precision)
    return frame


def dim0_shard_numel(shapes: Sequence[tuple[int, ...]], n_d: int, rank: int, *,
                    padded: bool) -> int:
    """Elements rank `rank` holds when every parameter is split along its first dimension as
    torch's FSDP2 does (`torch.chunk`: ⌈d0/N_d⌉ rows per rank, the last ranks fewer or none).
    `padded`: FSDP2's sharded parameters and gradients live in a buffer padded to ⌈d0/N_d⌉
    rows on every rank; its optimizer states (made by ``zeros_like`` on the shard) are not."""
    total = 0
    for shape in shapes:
        rows = shape[0] if shape else 1
        per_row = math.prod(shape[1:]) if shape else 1
        chunk = -(-rows // n_d)
        mine = chunk if padded else max(0, min(chunk, rows - rank * chunk))
        total += mine * per_row
    return total


def predicted_rows(measured, cfg: GPTConfig = DEFAULT_CONFIG):
    """`measured` (from `run_methods`) with the predictions beside it: ``pred_*`` the paper's
    exact Ψ/N_d for the run's recipe (fp32 Adam, or mixed-precision Adam's 2 + 2 + 12);
    ``padded_*`` what the implementation stores: flat groups padded to multiples of N_d
    (ZeRO-1/2, FSDP), dim-0 chunks per parameter (torch FSDP2), fp32 shards as 4 + 4 + 8
    (`FP32_SHARDS`)."""
    model = TinyGPT(cfg)
    psi = count_parameters(model)
    shapes = [tuple(p.shape) for p in model.parameters()]
    out = measured.copy()
    for kind in ("params", "grads", "optimizer"):
        exact, padded = [], []
        for _, row in measured.iterrows():
            n, stage = int(row.world_size), int(row.stage)
            mixed = row.get("precision", "fp32") == "mixed"
            paper = MIXED_ADAM if mixed else FP32_ADAM
            held = FP32_ADAM if row.method in FP32_SHARDS else paper  # what the shards keep
            exact.append(getattr(model_state_bytes(psi, n, stage, paper), kind))
            if row.method == "torch_fsdp2":
                bytes_per = {"params": 4, "grads": 4, "optimizer": 8}[kind]
                padded.append(bytes_per * dim0_shard_numel(
                    shapes, n, int(row["rank"]), padded=kind != "optimizer"))
            elif stage == 0:
                padded.append(exact[-1])
            else:
                padded.append(sum(
                    getattr(model_state_bytes(g, n, stage, held, padded=True), kind)
                    for g in row.groups))
        out[f"pred_{kind}"] = exact
        out[f"padded_{kind}"] = padded
    out["measured_total"] = out.params + out.grads + out.optimizer
    out["pred_total"] = out.pred_params + out.pred_grads + out.pred_optimizer
    out["padded_total"] = out.padded_params + out.padded_grads + out.padded_optimizer
    out["psi"] = psi
    return out


__all__ = ["DEFAULT_CONFIG", "FP32_SHARDS", "METHODS", "MIXED_METHODS", "PRECISIONS", "STAGE",
           "dim0_shard_numel", "predicted_rows", "run_methods"]
