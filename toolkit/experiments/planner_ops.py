"""Rank-side benches for `toolkit.planner.calibrated`: every `Op` of a step, alone at its size,
forward and backward, and the all-reduce of every group size, timed in core time.

An op's bench runs what the step runs for it (the same torch calls; the attention core is
TinyGPT's own `attend` with the views that split and merge the heads; the optimizer is SGD over
`stand_ins` of the rank's parameters, the same shapes), so that "work / measured time" is the
rate that op gets inside a step. Gradients come back through `torch.autograd.grad` (nothing
accumulates between calls), as in a step where each gradient flows on to the op before. Every
rank times the same op at once (a barrier before each), as in a step where all ranks compute.

Operands: in a step, backward reads what forward saved long before, and a layer's weights were
last touched a whole pass earlier. So a bench takes a new set of operands each call from an
`OperandPool`, a block of memory as large as the caches; large operands then come from memory,
small ones (a set spans at most `MAX_SETS` of them) stay in cache, as a small micro-batch's do.
Without a pool a bench reuses one set (in cache): the glue is measured that way, a whole model
against its ops, both in cache.

Clocks: compute ops run on the calling thread (one intra-op thread per rank), so
`toolkit.experiments.roofline.time_kernel`'s core time (the thread's CPU time) is all of their
work. An all-reduce also works on gloo's threads (copies, adds, socket calls), so its bench
reads `time.process_time` (every thread of the rank); waiting for a peer costs no CPU (gloo
blocks, it does not spin), but now and then a call costs several times its median, so the
bench reports the mean of many calls.
"""

from __future__ import annotations

import itertools
import math
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..models import CausalSelfAttention, GPTConfig, TinyGPT
from ..planner.calibrated import Op
from .roofline import time_kernel

__all__ = ["OperandPool", "all_reduce_cpu", "average_gradients", "model_bench", "op_bench",
           "stand_ins", "time_all_reduce", "time_op"]


def average_gradients(params: Sequence[torch.Tensor], group, size: int, *,
                      reduce: bool = True) -> None:
    """Data parallelism's exchange in one flat bucket: concatenate the gradients, all-reduce
    over `group` (skipped when not `reduce`: the copies alone, the `flatten` op), divide by the
    group's `size`, copy back."""
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    if reduce:
        dist.all_reduce(flat, group=group)
    flat /= size
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
        offset += p.numel()


class OperandPool:
    """One block of random fp32 numbers that benches cut their operands from, each cut the next
    stretch (wrapping round): with a pool larger than the caches, every call of a bench reads
    operands that are not in cache, as a step's ops do (module docstring)."""

    def __init__(self, nbytes: int, *, device: torch.device | str = "cpu") -> None:
        self.data = torch.empty(max(1, nbytes // 4), device=device).uniform_(-1.0, 1.0)
        self.at = 0

    def cut(self, shape: tuple[int, ...]) -> torch.Tensor:
        """The next stretch of the pool as a leaf of `shape` that autograd differentiates."""
        n = math.prod(shape)
        if n > self.data.numel():
            raise ValueError(f"OperandPool: {n} elements asked of a pool of {self.data.numel()}")
        if self.at + n > self.data.numel():
            self.at = 0
        view = self.data[self.at:self.at + n].view(shape)
        self.at += n
        return view.requires_grad_()


def _operands(op: Op, cfg: GPTConfig, dev: torch.device
              ) -> tuple[list[tuple[int, ...]], Callable[..., torch.Tensor]]:
    """The shapes of `op`'s differentiable operands and its forward as a function of them."""
    kind, shape = op.kind, op.shape
    if kind == "linear":
        t, k, n, bias = shape
        return [(t, k), (n, k)] + [(n,)] * bias, lambda x, w, *b: F.linear(x, w, *b)
    if kind == "attention":
        b, a, s, d = shape
        with torch.device("meta"):  # only its attend() runs, which uses no weight
            core = CausalSelfAttention(GPTConfig(vocab_size=2, seq_len=s, d_model=a * d,
                                                 n_head=a, n_layer=1))

        def heads(x: torch.Tensor) -> torch.Tensor:  # (b, s, a·d) -> (b, a, s, d), a view
            return x.view(b, s, a, d).transpose(1, 2)

        # As the block runs it: heads out of the projections' outputs, and merged back after.
        return [(b, s, a * d)] * 3, lambda q, k, v: core.attend(
            heads(q), heads(k), heads(v)).transpose(1, 2).reshape(b, s, a * d)
    if kind == "layernorm":
        t, h = shape
        return [(t, h), (h,), (h,)], lambda x, w, b: F.layer_norm(x, (h,), w, b)
    if kind in ("gelu", "copy"):
        return [shape], F.gelu if kind == "gelu" else (
            lambda x: x.detach().clone(memory_format=torch.contiguous_format))
    if kind in ("residual", "bias"):
        return [shape, shape if kind == "residual" else shape[-1:]], torch.add
    if kind == "embedding":
        t, h = shape
        idx = torch.randint(cfg.vocab_size, (t // cfg.seq_len, cfg.seq_len), device=dev)
        where = torch.arange(cfg.seq_len, device=dev)
        return [(cfg.vocab_size, h), (cfg.seq_len, h)], \
            lambda tok, pos: F.embedding(idx, tok) + F.embedding(where, pos)
    if kind == "loss":
        t, vocab = shape
        target = torch.randint(vocab, (t,), device=dev)
        return [shape], lambda logits: F.cross_entropy(logits, target)
    raise ValueError(f"op_bench: {op.label()} is not a per-tensor op")


MAX_SETS = 64  # operand sets per bench: large operands span the pool, small ones stay in cache


def op_bench(op: Op, cfg: GPTConfig, *, params: Sequence[torch.nn.Parameter] | None = None,
             pool: OperandPool | None = None,
             device: torch.device | str = "cpu") -> Callable[[], object]:
    """A function running one forward + backward of `op` (`toolkit.planner.calibrated`'s table)
    on `device`. Operands come from `pool`, a new set each call, out of cache when the pool is
    larger than the caches; None: one set, reused (in cache). `params`: `stand_ins` of the
    rank's parameters, for the per-parameter ops (accumulate, optimizer, flatten), whose cost
    depends on how many tensors there are."""
    dev = torch.device(device)
    if op.kind in ("accumulate", "optimizer", "flatten"):
        return _parameter_bench(op, params)
    shapes, forward = _operands(op, cfg, dev)
    if pool is None:
        sets = [[torch.randn(sh, device=dev, requires_grad=True) for sh in shapes]]
    else:
        per_set = sum(math.prod(sh) for sh in shapes)
        sets = [[pool.cut(sh) for sh in shapes]
                for _ in range(max(1, min(MAX_SETS, pool.data.numel() // per_set)))]
    turn = itertools.cycle(sets)
    if op.kind == "copy":  # f and g copy what they all-reduce; nothing to differentiate
        return lambda: forward(next(turn)[0])
    seed = torch.ones_like(forward(*sets[0]))
    if op.kind == "residual":
        def residual() -> object:
            x, r = next(turn)
            gx, gr = torch.autograd.grad(forward(x, r), [x, r], seed)
            return gx + gr  # the stream's gradient meets the branch's at x: one sum
        return residual

    def call() -> object:
        leaves = next(turn)
        return torch.autograd.grad(forward(*leaves), leaves, seed)
    return call


def stand_ins(params: Sequence[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
    """Parameters of the same shapes as `params` (values 1e-3, so that sums neither overflow nor
    turn subnormal), each with a gradient: what the per-parameter benches work on, so that they
    leave the rank's own weights alone. The benches of one set share it (2 copies of P numbers)."""
    out = [torch.nn.Parameter(torch.full_like(p, 1e-3)) for p in params]
    for p in out:
        p.grad = torch.full_like(p, 1e-3)
    return out


def _parameter_bench(op: Op, params: Sequence[torch.nn.Parameter] | None) -> Callable[[], object]:
    if params is None or sum(p.numel() for p in params) != op.shape[0]:
        raise ValueError(f"op_bench: {op.label()} needs the rank's parameters' `stand_ins` "
                         f"({op.shape[0]} elements in all) as `params`")
    if any(p.grad is None for p in params):
        raise ValueError("op_bench: every parameter in `params` needs a .grad (`stand_ins`)")
    grads = [p.grad for p in params]
    if op.kind == "accumulate":  # what autograd's AccumulateGrad does from micro-batch 2 on
        return lambda: [g.add_(p.detach()) for p, g in zip(params, grads)]
    if op.kind == "optimizer":
        opt = torch.optim.SGD(params, lr=0.0)  # lr 0: the same work, weights that stay put

        def step() -> None:
            opt.step()
            opt.zero_grad(set_to_none=True)
            for p, g in zip(params, grads):  # the next call's gradients, as backward leaves them
                p.grad = g
        return step
    # Divided by 1: the same work, gradients that keep their size however often it runs.
    return lambda: average_gradients(params, None, 1, reduce=False)


def model_bench(model: TinyGPT, tokens: int, *, device: torch.device | str = "cpu"
                ) -> Callable[[], object]:
    """A dense `TinyGPT` forward + backward (loss included) on `tokens` / seq_len sequences: what
    a micro-batch costs whole, against which the sum of its ops is set (`Calibration.glue`)."""
    cfg = model.cfg
    idx = torch.randint(cfg.vocab_size, (tokens // cfg.seq_len, cfg.seq_len), device=device)
    params = list(model.parameters())
    return lambda: torch.autograd.grad(model(idx, idx)[1], params)


def time_op(fn: Callable[[], object], *, trials: int,
            device: torch.device | str = "cpu") -> tuple[float, float]:
    """(core, wall) median seconds per call of an op's bench (`time_kernel`)."""
    timing = time_kernel(fn, trials=trials, device=device)
    return timing["core"].median, timing["wall"].median


def time_all_reduce(nbytes: int, group, *, calls: int = 24,
                    device: torch.device | str = "cpu") -> tuple[float, float]:
    """(core, wall) mean seconds per all-reduce of `nbytes` (fp32) over `group`, over `calls`
    calls back to back after a warm-up: the mean, since a step pays every call and this cost is
    heavy-tailed (a call now and then takes several times the median's CPU). Core is this
    rank's CPU time, every thread counted (on a GPU, wall time after a synchronize)."""
    dev = torch.device(device)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    buf = torch.zeros(max(1, nbytes // 4), device=dev)  # zeros: sums stay finite
    dist.all_reduce(buf, group=group)  # warm-up: the first call sets up gloo's buffers
    dist.barrier(group=group)
    sync()
    w, c = time.perf_counter(), time.process_time()
    for _ in range(calls):
        dist.all_reduce(buf, group=group)
    sync()
    wall = (time.perf_counter() - w) / calls
    return ((time.process_time() - c) / calls if dev.type != "cuda" else wall), wall


@contextmanager
def all_reduce_cpu() -> Iterator[list[float]]:
    """Inside a rank: every `dist.all_reduce` made in the block appends its CPU seconds
    (`time.process_time`, every thread) to the list yielded; restored on exit. For reading how
    much of a step its all-reduces cost (on CPU; on a GPU the time is the kernel's)."""
    spent: list[float] = []
    inner = dist.all_reduce

    def timed(*args, **kwargs):
        c = time.process_time()
        try:
            return inner(*args, **kwargs)
        finally:
            spent.append(time.process_time() - c)

    dist.all_reduce = timed
    try:
        yield spent
    finally:
        dist.all_reduce = inner
