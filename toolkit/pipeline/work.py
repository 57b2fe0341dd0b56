"""A layer that takes a known time, so pipeline timings on a shared CPU mean something.

On a laptop the tiny models' matrix products take microseconds, less than one gloo message
(~100 µs), and 4 ranks on 2 cores take turns on the CPU: measured bubbles would show the
scheduler, not the schedule. `Delay` stands in for a stage's compute: its forward sleeps
`forward` seconds per sample of the batch and its backward `backward` seconds per sample, and
passes values and gradients through unchanged. A sleeping rank leaves the core to the others,
so p ranks on fewer cores still "compute" in parallel, and splitting a batch into m
micro-batches splits the work m ways, as real compute would. Put one in each stage
(`delay_blocks`), or after any layer.

A backward split into B (input gradient) and W (weight gradient) (Qi et al., "Zero Bubble
Pipeline Parallelism", ICLR 2024) needs the two parts to take separate times: with `weight` > 0
the layer multiplies its output by a one-element parameter, `clock`, equal to 1 (so values and
input gradients are bitwise unchanged) whose gradient path sleeps `weight` seconds per sample.
The input-gradient path sleeps `backward`; an unsplit backward runs both paths, so it takes
`backward` + `weight`, and a split one takes `backward` in B and `weight` in W.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

import torch
from torch import Tensor, nn

from ..arguments import check_int


_SLEEP = [True]   # switched off by `no_delay` (a shape probe must not take time)


@contextmanager
def no_delay() -> Iterator[None]:
    """Within this block every `Delay` passes through at once (used to probe shapes)."""
    _SLEEP[0] = False
    try:
        yield
    finally:
        _SLEEP[0] = True


class _Sleep(torch.autograd.Function):
    """Identity both ways; sleeps rows·forward going forward and rows·backward coming back
    (the input-gradient path)."""

    @staticmethod
    def forward(ctx, x: Tensor, forward: float, backward: float) -> Tensor:
        ctx.seconds = backward * x.shape[0]
        if _SLEEP[0]:
            time.sleep(forward * x.shape[0])
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        if _SLEEP[0]:
            time.sleep(ctx.seconds)
        return grad, None, None


class _WeightSleep(torch.autograd.Function):
    """Identity on the clock parameter; its backward (the weight-gradient path) sleeps."""

    @staticmethod
    def forward(ctx, clock: Tensor, seconds: float) -> Tensor:
        ctx.seconds = seconds
        return clock.view_as(clock)

    @staticmethod
    def backward(ctx, grad: Tensor):
        if _SLEEP[0]:
            time.sleep(ctx.seconds)
        return grad, None


class Delay(nn.Module):
    """Identity layer that sleeps `forward` s per sample forward, `backward` s per sample on the
    input-gradient path and `weight` s per sample on the weight-gradient path (a calibrated
    stand-in for compute; see the module docstring)."""

    def __init__(self, forward: float = 1e-3, backward: float = 2e-3, weight: float = 0.0, *,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        if not (forward >= 0 and backward >= 0 and weight >= 0):
            raise ValueError(f"Delay: forward, backward and weight must be seconds >= 0, got "
                             f"{forward}, {backward}, {weight}")
        self.forward_s, self.backward_s = float(forward), float(backward)
        self.weight_s = float(weight)
        # Only a layer with weight time has a parameter: without it, nothing changes.
        clock = nn.Parameter(torch.ones((), device=device)) if weight > 0 else None
        self.register_parameter("clock", clock)

    def forward(self, x: Tensor) -> Tensor:
        out = _Sleep.apply(x, self.forward_s, self.backward_s)
        if self.clock is None:
            return out
        return out * _WeightSleep.apply(self.clock, self.weight_s * x.shape[0])

    def extra_repr(self) -> str:
        return (f"forward={self.forward_s:g} s/sample, backward={self.backward_s:g} s/sample"
                + (f", weight={self.weight_s:g} s/sample" if self.clock is not None else ""))


def delay_blocks(n: int, *, width: int = 16, forward: float = 1e-3, backward: float = 2e-3,
                 weight: float = 0.0, seed: int = 0) -> list[nn.Module]:
    """`n` blocks Linear(width, width) → ReLU → `Delay`: a model whose every block takes a known
    time per sample (`weight` > 0: the backward's weight-gradient part separately), to cut into
    pipeline stages. Weights are seeded (same on every rank)."""
    check_int("delay_blocks", "n", n, hint="number of blocks")
    gen = torch.Generator().manual_seed(seed)
    blocks = []
    for _ in range(n):
        with torch.device("meta"):       # no default init: the global RNG stays untouched
            lin = nn.Linear(width, width)
        lin = lin.to_empty(device="cpu")
        with torch.no_grad():
            bound = 1.0 / width ** 0.5
            lin.weight.uniform_(-bound, bound, generator=gen)
            lin.bias.uniform_(-bound, bound, generator=gen)
        blocks.append(nn.Sequential(lin, nn.ReLU(), Delay(forward, backward, weight)))
    return blocks


__all__ = ["Delay", "delay_blocks", "no_delay"]
