"""DeepSpeed and Hugging Face Accelerate beside the course's ZeRO and DDP: same ranks, model,
data, optimizer and gradient accumulation.

ZeRO (Rajbhandari et al., SC 2020, §5): stage 1 shards the optimizer states, stage 2 the
gradients too, stage 3 the parameters too; the mean gradient, and so plain SGD's step, is the
same at every stage. Gradient accumulation over k micro-batches of the loss scaled by 1/k gives
the gradient of the whole batch (lesson 01). So DeepSpeed at any stage, fed the same samples in
the same order, takes the steps of the course's `OverlappedDDP` (stage 0), `ShardedOptimizer`
(stages 1, 2) and `FullyShardedDataParallel` (stage 3). Not to the bit: DeepSpeed's stage 2 and
3 reduce every micro-batch's gradient and add the reduced ones, the course reduces the sum once,
and (a + b) + (c + d) may differ from (a + c) + (b + d) in the last bit.

Runs (`RUNS`), all in one launch of 2 gloo CPU ranks, each recorded by `toolkit.comm` (DeepSpeed
calls ``torch.distributed`` from Python, so the recorder sees every gradient it sends; torch's
DDP under Accelerate calls its all-reduces from C++, unseen as under Lightning):

=================  ===========================================================================
run                what trains
=================  ===========================================================================
deepspeed_zero0    ``deepspeed.initialize(config=deepspeed_config(stage=0))``: plain data
deepspeed_zero1    parallelism, then ZeRO stages 1, 2 and 3, DeepSpeed's own engine and
deepspeed_zero2    optimizer wrappers around the same ``torch.optim.SGD``
deepspeed_zero3
course_zero0       `OverlappedDDP` + `accumulate_gradients` (``no_sync`` but for the last)
course_zero1       `ShardedOptimizer(stage=1)` + `accumulate_gradients`
course_zero2       `ShardedOptimizer(stage=2)` + `accumulate_gradients`
course_zero3       `FullyShardedDataParallel` + `accumulate_gradients`
accelerate_ddp     ``Accelerator(cpu=True, gradient_accumulation_steps=k)`` and ``accumulate()``
accelerate_fsdp    the same with ``fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2)``
deepspeed_default  ``deepspeed_zero0`` without ``gradient_clipping`` in its config: DeepSpeed's
                   default, 1.0, clips the global gradient norm
course_clipped     ``course_zero0`` + ``torch.nn.utils.clip_grad_norm_(max_norm=1.0)``
=================  ===========================================================================

The DeepSpeed runs but ``deepspeed_default`` write ``"gradient_clipping": 0.0`` (off), so that
SGD's step is the plain one the course's runs take.

Every run deals the samples with `shard_indices` (``DistributedSampler``'s rule, lesson 16
section 3), ``batch_size`` per rank per step cut into ``micro_batches``.

DeepSpeed is imported inside the ranks (never in the caller): with a GPU present its import
probes CUDA, after which a fork is unsafe (`toolkit.launch`). ``DS_ACCELERATOR=cpu`` keeps these
runs on the CPU wherever they run; DeepSpeed's CPU accelerator picks gloo.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.distributed as dist

from .. import comm
from ..arguments import check_int
from ..data_parallel.accumulation import accumulate_gradients, split_batch
from ..data_parallel.ddp import OverlappedDDP
from ..data_parallel.fsdp import FullyShardedDataParallel
from ..data_parallel.sampler import shard_indices
from ..data_parallel.zero import ShardedOptimizer
from ..framework_settings import deepspeed_config
from ..launch import device, spawn
from ..models import course_loss
from .train_config import TrainConfig, max_param_diff

STAGES = (0, 1, 2, 3)
DEEPSPEED_RUNS = tuple(f"deepspeed_zero{s}" for s in STAGES)
COURSE_RUNS = tuple(f"course_zero{s}" for s in STAGES)
ACCELERATE_RUNS = ("accelerate_ddp", "accelerate_fsdp")
CLIP_RUNS = ("deepspeed_default", "course_clipped")
RUNS = DEEPSPEED_RUNS + COURSE_RUNS + ACCELERATE_RUNS + CLIP_RUNS
DEFAULT_CLIP = 1.0
"""DeepSpeed's ``gradient_clipping`` when the config leaves it out (DeepSpeed 0.19's
``GRADIENT_CLIPPING_DEFAULT``; its config documentation says 1.0 too)."""
ENV = {"DS_ACCELERATOR": "cpu"}
"""The ranks' environment: DeepSpeed and Accelerate on the CPU (module docstring)."""


@dataclass(frozen=True)
class AccumConfig:
    """What every run trains: `TrainConfig`'s model, data and SGD, each rank's batch of
    ``train.batch_size`` samples cut into ``micro_batches`` equal micro-batches."""

    train: TrainConfig = TrainConfig()
    micro_batches: int = 2
    """Gradient accumulation steps (DeepSpeed's ``gradient_accumulation_steps``)."""

    def __post_init__(self) -> None:
        check_int("AccumConfig", "micro_batches", self.micro_batches)
        if self.train.batch_size % self.micro_batches:
            raise ValueError(f"AccumConfig: micro_batches={self.micro_batches} must divide "
                             f"train.batch_size={self.train.batch_size} (equal micro-batches)")

    @property
    def micro_batch_size(self) -> int:
        return self.train.batch_size // self.micro_batches

    def batches(self, rank: int, world_size: int) -> list[list[int]]:
        """This rank's sample indices per optimizer step, every epoch (`shard_indices`)."""
        out = []
        for epoch in range(self.train.epochs):
            order = shard_indices(self.train.samples, rank=rank, world_size=world_size,
                                  epoch=epoch)
            out += [order[i:i + self.train.batch_size]
                    for i in range(0, len(order), self.train.batch_size)]
        return out


@dataclass
class RankRun:
    """One run on every rank."""

    name: str
    losses: list[list[float]]
    """[rank][step]: the mean loss over the rank's micro-batches, before the step."""
    params: list[dict[str, torch.Tensor]]
    """[rank]: the full parameters after training, on the CPU."""
    events: list[comm.Event] = field(repr=False)
    """What the recorder saw, every rank, in time order (setup included)."""
    info: list[dict[str, Any]] = field(default_factory=list)
    """[rank]: what the framework said about itself (its class names, distributed type)."""

    def max_param_diff(self, other: "RankRun") -> float:
        """Largest |difference| between rank 0's final parameters here and in `other`."""
        return max_param_diff(self.params[0], other.params[0], names=(self.name, other.name))

    def calls(self, op: str, *, rank: int = 0) -> int:
        return sum(e.op == op for e in self.events if e.rank == rank)

    def sent(self, *, rank: int = 0, prefix: str = "") -> int:
        """Bytes rank `rank` passed to recorded calls whose op starts with `prefix`."""
        return sum(e.nbytes for e in self.events if e.rank == rank and e.op.startswith(prefix))


def _full(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().to("cpu").clone() for n, p in model.named_parameters()}


@contextlib.contextmanager
def _quiet_frameworks():
    """DeepSpeed's and Accelerate's info logs and warnings about a CPU run, off."""
    for name in ("DeepSpeed", "deepspeed", "accelerate"):
        logging.getLogger(name).setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=r"(deepspeed|accelerate)\b")
        warnings.filterwarnings("ignore", message=r".*(OMP_NUM_THREADS|untested optimizer)")
        yield


def _deepspeed(stage: int, config: AccumConfig, rank: int, world_size: int, *,
               clip: float | None = 0.0) -> dict:
    import deepspeed  # in the rank (module docstring)
    import deepspeed.ops

    # The CPU accelerator compiles a shared-memory all-reduce (C++, minutes) when DeepSpeed's
    # communication starts. Only inference_all_reduce uses it; training never does. The dict is
    # DeepSpeed's own per-process cache of which ops may be built.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    dev = device()
    _, x, y = config.train.dataset().tensors
    x, y = x.to(dev), y.to(dev)
    model = config.train.build_model(dev)
    names = [n for n, _ in model.named_parameters()]
    ds_config = deepspeed_config(micro_batch=config.micro_batch_size,
                                 accumulation=config.micro_batches, world_size=world_size,
                                 stage=stage, clip=clip)
    losses = []
    with comm.recording() as trace:
        engine, *_ = deepspeed.initialize(model=model, config=ds_config,
                                          optimizer=torch.optim.SGD(model.parameters(),
                                                                    lr=config.train.lr),
                                          dist_init_required=False)
        for batch in config.batches(rank, world_size):
            total = 0.0
            for micro in torch.tensor(batch, device=dev).split(config.micro_batch_size):
                loss = course_loss(engine, x[micro], y[micro])
                engine.backward(loss)   # scales by 1/gradient_accumulation_steps
                engine.step()           # steps the optimizer at the accumulation boundary
                total += loss.item() / config.micro_batches
            losses.append(total)
    if stage == 3:  # parameters are partitioned: gather them (outside the recording)
        with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
            params = _full(engine.module)
    else:
        params = _full(engine.module)
    info = {"engine": type(engine).__name__, "optimizer": type(engine.optimizer).__name__,
            "zero_stage": engine.zero_optimization_stage(),
            "gradient_accumulation_steps": engine.gradient_accumulation_steps()}
    return dict(losses=losses, events=trace.events, info=info,
                params={n: params[n] for n in names})


def _course(stage: int, config: AccumConfig, rank: int, world_size: int, *,
            clip: float = 0.0) -> dict:
    dev = device()
    _, x, y = config.train.dataset().tensors
    x, y = x.to(dev), y.to(dev)
    model = config.train.build_model(dev)
    names = [n for n, _ in model.named_parameters()]
    lr = config.train.lr
    losses = []
    with comm.recording() as trace:
        if stage == 0:
            wrapped = OverlappedDDP(model)
            opt = torch.optim.SGD(wrapped.parameters(), lr=lr)
        elif stage in (1, 2):
            wrapped = model  # ZeRO-1/2 average inside step(): no wrapper
            opt = ShardedOptimizer(model.parameters(), torch.optim.SGD, stage=stage, lr=lr)
        else:
            wrapped = FullyShardedDataParallel(model)
            opt = torch.optim.SGD(wrapped.parameters(), lr=lr)
        for batch in config.batches(rank, world_size):
            index = torch.tensor(batch, device=dev)
            opt.zero_grad()
            loss = accumulate_gradients(wrapped, split_batch(x[index], y[index],
                                                             micro_batches=config.micro_batches),
                                        course_loss)
            if clip:  # the gradients are the mean over ranks here: every rank clips alike
                torch.nn.utils.clip_grad_norm_(wrapped.parameters(), max_norm=clip)
            opt.step()
            losses.append(loss.item())
    params = wrapped.full_state_dict() if stage == 3 else dict(model.named_parameters())
    return dict(losses=losses, events=trace.events, info={"optimizer": type(opt).__name__},
                params={n: params[n].detach().to("cpu").clone() for n in names})


def _accelerate(run: str, config: AccumConfig, rank: int, world_size: int) -> dict:
    from accelerate import Accelerator
    from accelerate.utils import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(fsdp_version=2) if run == "accelerate_fsdp" else None
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=config.micro_batches,
                              fsdp_plugin=plugin)
    dev = accelerator.device   # the CPU: Accelerator(cpu=True)
    _, x, y = config.train.dataset().tensors
    x, y = x.to(dev), y.to(dev)
    model = config.train.build_model(dev)
    names = [n for n, _ in model.named_parameters()]
    losses = []
    with comm.recording() as trace:
        prepared = accelerator.prepare(model)
        opt = accelerator.prepare(torch.optim.SGD(prepared.parameters(), lr=config.train.lr))
        for batch in config.batches(rank, world_size):
            total = 0.0
            for micro in torch.tensor(batch, device=dev).split(config.micro_batch_size):
                # accumulate(): no gradient sync but at the boundary, loss / k, opt.step() and
                # zero_grad() do nothing until then (Accelerate's gradient accumulation guide).
                with accelerator.accumulate(prepared):
                    loss = course_loss(prepared, x[micro], y[micro])
                    accelerator.backward(loss)
                    opt.step()
                    opt.zero_grad()
                total += loss.item() / config.micro_batches
            losses.append(total)
    info = {"distributed_type": str(accelerator.distributed_type).split(".")[-1],
            "prepared": type(prepared).__name__}
    return dict(losses=losses, events=trace.events, info=info,
                params={n: v for n, v in _full(model).items() if n in names})


def _rank(rank: int, world_size: int, runs: Sequence[str], config: AccumConfig) -> dict:
    out = {}
    with _quiet_frameworks():
        for run in runs:
            dist.barrier()  # runs start together; outside every recording
            if run in DEEPSPEED_RUNS:
                out[run] = _deepspeed(int(run[-1]), config, rank, world_size)
            elif run in COURSE_RUNS:
                out[run] = _course(int(run[-1]), config, rank, world_size)
            elif run == "deepspeed_default":
                out[run] = _deepspeed(0, config, rank, world_size, clip=None)
            elif run == "course_clipped":
                out[run] = _course(0, config, rank, world_size, clip=DEFAULT_CLIP)
            else:
                out[run] = _accelerate(run, config, rank, world_size)
    return out


def compare_zero(runs: Sequence[str] = RUNS, *, config: AccumConfig = AccumConfig(),
                 world_size: int = 2, timeout: float = 180) -> dict[str, RankRun]:
    """Train every run in `runs` in one launch of `world_size` gloo ranks (module docstring);
    run name -> `RankRun`, in the order of `runs`."""
    unknown = [r for r in runs if r not in RUNS]
    if unknown:
        raise ValueError(f"compare_zero: unknown runs {unknown}; choose from {RUNS}")
    check_int("compare_zero", "world_size", world_size)
    per_rank = spawn(_rank, world_size, list(runs), config, backend="gloo", timeout=timeout,
                     echo=False, env=ENV)
    results = {}
    for run in runs:
        ranks = [r[run] for r in per_rank]
        events = sorted((e for r in ranks for e in r["events"]),
                        key=lambda e: (e.start, e.rank, e.seq))
        results[run] = RankRun(run, [r["losses"] for r in ranks], [r["params"] for r in ranks],
                               events, [r["info"] for r in ranks])
    return results


__all__ = ["ACCELERATE_RUNS", "CLIP_RUNS", "COURSE_RUNS", "DEEPSPEED_RUNS", "DEFAULT_CLIP",
           "ENV", "RUNS", "STAGES",
           "AccumConfig", "RankRun", "compare_zero"]
