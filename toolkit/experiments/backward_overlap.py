"""Lesson 06's exercise on ranks: a backward pass whose gradient all-reduces start while backward
is still running, written by the student, run on real ranks and read from its profiler trace.

The student writes ``backward_fn(loss, params)``: run backward on ``loss`` so that, when it
returns, every ``p.grad`` holds the mean of that gradient over the ranks. The slow way (lesson
04's first DDP; the "blocking all-reduce" of exercise 1) calls ``loss.backward()`` and then
all-reduces each gradient; the fast way starts each all-reduce as soon as its gradient is final
(Li et al., "PyTorch Distributed", VLDB 2020, section 3.2.3: overlap communication with the
backward of earlier layers) and waits for them all at the end.

`on_ranks(backward_fn, folder=...)` makes the rank function that `toolkit.exercises.attempt`
spawns. Each rank builds the exercises' `TinyMLP` (`EXERCISE_SETUP` of
`toolkit.experiments.profiling`), draws its own batch, and first computes its **local**
gradients with a plain ``loss.backward()`` (before the student's code has run, so no hook of
theirs can touch them); then it runs ``backward_fn`` in two warm-up steps and a third under
``torch.profiler`` (the same model, batch and parameters each time: no optimizer step). It
returns the local gradients, the gradients after the traced step, the trace's path and the time
the traced step began (to split the recorder's events by step). The check then asks only plain
questions (`check`): is each gradient the mean of the ranks' local ones; were the gradient
bytes all-reduced exactly once in the traced step; did an all-reduce start before backward's
last matmul on the thread that ran backward (program order, which no scheduler can change;
counted by `toolkit.viz.overlap.symptoms` from the trace).
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function

from ..comm.events import Event
from ..launch import device
from ..models import TinyMLP, make_regression_data
from .profiling import EXERCISE_SETUP

__all__ = ["check", "on_ranks"]

BackwardFn = Callable[[torch.Tensor, list[torch.nn.Parameter]], None]


def _rank(rank: int, world_size: int, *, backward_fn: BackwardFn, folder: str) -> dict:
    dev = device()
    width, depth, batch = (EXERCISE_SETUP[k] for k in ("width", "depth", "batch"))
    model = TinyMLP(d_in=width, d_hidden=width, d_out=width, depth=depth, seed=0, device=dev)
    params = list(model.parameters())
    x, y = make_regression_data(batch, width, width, seed=rank, device=dev)

    F.mse_loss(model(x), y).backward()  # the local gradients, before any hook of the student's
    local = [p.grad.detach().clone() for p in params]

    def step() -> None:
        model.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x), y)
        with record_function("backward"):
            backward_fn(loss, params)

    for _ in range(2):  # warm-up: a hook registered in one call and left on fires in the next
        step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    dist.barrier()
    started = time.time()
    with profile(activities=activities, record_shapes=True) as prof:
        step()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    path = Path(folder) / f"exercise-backward-rank{rank}.json"
    prof.export_chrome_trace(str(path))
    grads = [None if p.grad is None else p.grad.detach().clone() for p in params]
    dist.barrier()  # no rank leaves while a peer may still be all-reducing with it
    return {"local": local, "grads": grads, "path": str(path), "started": started}


def on_ranks(backward_fn: BackwardFn, *, folder: str | Path) -> Callable[..., dict]:
    """The rank function for ``toolkit.exercises.attempt(n, on_ranks(fn, folder=...), p)``
    (module docstring). It carries `backward_fn`'s name, so that while `backward_fn` is still
    the stub, attempt asks for it by its name."""
    if not Path(folder).is_dir():
        raise ValueError(f"on_ranks: folder {folder} does not exist; create it first")
    fn = functools.partial(_rank, backward_fn=backward_fn, folder=str(folder))
    fn.__name__ = getattr(backward_fn, "__name__", "backward_fn")
    return fn


def check(results: Sequence[dict], recorded: Sequence[Event], early_launches: Sequence[int]
          ) -> list[tuple[str, bool, str]]:
    """The exercise's three questions for every rank, as (question, passed, what was observed),
    the question ``"values"``, ``"bytes"`` or ``"overlap"``: the
    gradients against the mean of the ranks' local ones; the bytes all-reduced in the traced
    step (from the recorder's calls) against the gradients' bytes; all-reduces launched before
    backward's last matmul (``early_launches[rank]``, read from the rank's trace by
    `toolkit.viz.overlap.symptoms`). Says what it saw, never what to write."""
    n = len(results)
    out = []
    for rank, r in enumerate(results):
        mean = [sum(other["local"][i] for other in results) / n for i in range(len(r["local"]))]
        wrong = [i for i, (g, m) in enumerate(zip(r["grads"], mean))
                 if g is None or g.shape != m.shape or not torch.allclose(g, m, atol=1e-6)]
        seen = (f"rank {rank}: gradient tensors {wrong} differ from the mean of the ranks' own "
                "gradients" if wrong else f"rank {rank}: every gradient is the mean over ranks")
        out.append(("values", not wrong, seen))
        grad_bytes = sum(t.numel() * t.element_size() for t in r["local"])
        sent = sum(e.nbytes for e in recorded if e.rank == rank and e.op == "all_reduce"
                   and e.start >= r["started"])
        out.append(("bytes", sent == grad_bytes, f"rank {rank}: the traced step all-reduced "
                                                 f"{sent:,} bytes for {grad_bytes:,} bytes of "
                                                 "gradients"))
        early = early_launches[rank]
        out.append(("overlap", early > 0, f"rank {rank}: {early} all-reduce(s) launched before "
                                          "backward's last matmul"))
    return out
