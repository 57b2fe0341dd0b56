"""A layer that takes a known time, so pipeline timings on a shared CPU mean something.

On a laptop the tiny models' matrix products take microseconds, less than one gloo message
(~100 µs), and 4 ranks on 2 cores take turns on the CPU: measured bubbles would show the
scheduler, not the schedule. `Delay` stands in for a stage's compute: its forward sleeps
`forward` seconds per sample of the batch and its backward `backward` seconds per sample, and
passes values and gradients through unchanged. A sleeping rank leaves the core to the others,
so p ranks on fewer cores still "compute" in parallel, and splitting a batch into m
micro-batches splits the work m ways, as real compute would. Put one in each stage
(`delay_blocks`), or after any layer.
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
    """Identity both ways; sleeps rows·forward going forward and rows·backward coming back."""

    @staticmethod
    def forward(ctx, x: Tensor, forward: float, backward: float) -> Tensor:
        ctx.seconds = backward * x.shape[0]
        if _SLEEP[0]:
            time.sleep(forward * x.shape[0])
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        time.sleep(ctx.seconds)
        return grad, None, None


class Delay(nn.Module):
    """Identity layer that sleeps `forward` s per sample forward and `backward` s per sample
    backward (a calibrated stand-in for compute; see the module docstring)."""

    def __init__(self, forward: float = 1e-3, backward: float = 2e-3) -> None:
        super().__init__()
        if not (forward >= 0 and backward >= 0):
            raise ValueError(f"Delay: forward and backward must be seconds >= 0, got "
                             f"{forward}, {backward}")
        self.forward_s, self.backward_s = float(forward), float(backward)

    def forward(self, x: Tensor) -> Tensor:
        return _Sleep.apply(x, self.forward_s, self.backward_s)

    def extra_repr(self) -> str:
        return f"forward={self.forward_s:g} s/sample, backward={self.backward_s:g} s/sample"


def delay_blocks(n: int, *, width: int = 16, forward: float = 1e-3, backward: float = 2e-3,
                 seed: int = 0) -> list[nn.Module]:
    """`n` blocks Linear(width, width) → ReLU → `Delay`: a model whose every block takes a known
    time per sample, to cut into pipeline stages. Weights are seeded (same on every rank)."""
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
        blocks.append(nn.Sequential(lin, nn.ReLU(), Delay(forward, backward)))
    return blocks


__all__ = ["Delay", "delay_blocks", "no_delay"]
