"""What each framework of lesson 16 does on this machine: installed or not, its version and import
time, and one short try on 2 gloo CPU ranks (or why it stops). Installs nothing.

    deepspeed      deepspeed.initialize at ZeRO stage 2 and one step of TinyMLP
    accelerate     Accelerator(cpu=True).prepare(TinyMLP) and one step
    megatron.core  parallel_state.initialize_model_parallel, then its DistributedDataParallel
    torchtitan     ParallelDims(dp_shard=2).build_mesh() on the CPU

Usage: python benchmarks/framework_probe.py [--only deepspeed,accelerate]
To try torchtitan or Megatron-Core, install them into a scratch environment that sees this
course's torch (pip checks that they leave it in place: `pip install --dry-run torchtitan`).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import subprocess
import sys
import time
import traceback

import torch

from toolkit.launch import RankError, spawn
from toolkit.models import TinyMLP, make_regression_data

PROBES = ("deepspeed", "accelerate", "megatron.core", "torchtitan")


def _step(model: torch.nn.Module, backward, step) -> None:
    x, y = make_regression_data(8, 8, 4)
    loss = torch.nn.functional.mse_loss(model(x), y)
    backward(loss)
    step()


def _try(rank: int, world_size: int, name: str) -> str:
    if name == "deepspeed":
        import deepspeed
        import deepspeed.ops
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # see framework_runs
        model = TinyMLP(seed=0)
        engine, *_ = deepspeed.initialize(
            model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            config={"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 2},
                    "zero_allow_untested_optimizer": True}, dist_init_required=False)
        _step(engine, engine.backward, engine.step)
        return f"ran: {type(engine.optimizer).__name__} on {engine.device}"
    if name == "accelerate":
        from accelerate import Accelerator
        accelerator = Accelerator(cpu=True)
        model = TinyMLP(seed=0)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model, opt = accelerator.prepare(model, opt)
        _step(model, accelerator.backward, opt.step)
        return f"ran: {accelerator.distributed_type}, {type(model).__name__}"
    if name == "megatron.core":
        from megatron.core import parallel_state
        from megatron.core.distributed import (DistributedDataParallel,
                                               DistributedDataParallelConfig)
        from megatron.core.transformer import TransformerConfig
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
        groups = f"dp = {parallel_state.get_data_parallel_world_size()}"
        config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1,
                                   use_cpu_initialization=True)
        DistributedDataParallel(config, DistributedDataParallelConfig(), TinyMLP(seed=0))
        return f"ran: groups built ({groups}), DistributedDataParallel built"
    from torchtitan.distributed.parallel_dims import ParallelDims
    dims = ParallelDims(dp_replicate=1, dp_shard=world_size, cp=1, tp=1, pp=1, ep=1,
                        world_size=world_size)
    dims.build_mesh()
    return f"ran: ParallelDims mesh built ({dims.dp_shard} shards)"


def probe(name: str) -> str:
    if importlib.util.find_spec(name.split(".")[0]) is None:
        return "not installed"
    # Import time in a fresh interpreter, on top of torch's.
    code = (f"import time, torch; t = time.perf_counter(); import {name}; "
            f"print(time.perf_counter() - t)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "DS_ACCELERATOR": "cpu"}, timeout=300)
    if out.returncode != 0:
        return f"import fails: {out.stderr.strip().splitlines()[-1]}"
    version = getattr(importlib.import_module(name), "__version__", "?")
    head = f"{version}, import {float(out.stdout.strip().splitlines()[-1]):.1f} s; "
    try:
        result = spawn(_try, 2, name, backend="gloo", timeout=240, echo=False,
                       env={"DS_ACCELERATOR": "cpu"})
        return head + result[0]
    except RankError as err:
        return head + f"stops on rank {err.rank}: {err.exc_type}: {str(err.exception)[:160]}"
    except Exception:  # a probe reports, it never stops the others
        return head + "stops: " + traceback.format_exc().strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(PROBES),
                        help=f"comma-separated subset of {', '.join(PROBES)}")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n]
    unknown = sorted(set(names) - set(PROBES))
    if unknown:
        parser.error(f"--only: unknown {unknown}; choose from {PROBES}")
    print(f"torch {torch.__version__}")
    for name in names:
        t0 = time.perf_counter()
        print(f"{name:14s} {probe(name)}  ({time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
