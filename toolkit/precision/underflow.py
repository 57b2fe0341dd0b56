"""Gradients of one backward, in a chosen precision and loss scale, to count what underflows.

Micikevicius et al., "Mixed Precision Training", ICLR 2018, §3.2 and Figure 3 (the activation
gradients of one network, the Multibox SSD detector): many values lie below fp16's range. fp16's
smallest subnormal is 2^-24; a magnitude of at most half of it, 2^-25, rounds to 0 (the tie goes
to the even neighbour, 0), and one in (2^-25, 2^-24) rounds up to 2^-24.
Scaling the loss by s multiplies every gradient of the backward by s (the chain rule is linear
in the loss), which moves them up into fp16's range; dividing by s afterwards, in fp32, gives
the gradient back, now without the zeros. `scaled_gradients` runs one backward of
``s · loss_fn(model)`` under ``torch.autocast`` and returns, unscaled and in float64:

    params        every parameter's gradient, flattened in `model.parameters()` order   (Ψ,)
    activations   the gradient at every Linear layer's output, as backward held it     (Σ b·s·out,)
                  (in the autocast dtype: where fp16 flushes first)

`flushed(low, reference)` counts the entries that are 0 in `low` but not in `reference` (an
fp32 run of the same step): the gradients lost to underflow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class Gradients:
    """One backward's gradients, divided by the loss scale, in float64."""

    params: Tensor
    """Every parameter's gradient, flattened (a parameter without one contributes zeros)."""
    activations: Tensor
    """The gradient at every `nn.Linear` output, flattened, as backward computed it."""


def scaled_gradients(model: nn.Module, loss_fn: Callable[[nn.Module], Tensor], *,
                     autocast: torch.dtype | None = None, scale: float = 1.0) -> Gradients:
    """Backward of ``scale · loss_fn(model)`` (under ``torch.autocast`` with dtype `autocast`
    when given), gradients divided by `scale` in float64 (module docstring). The model's
    ``.grad`` are cleared first and left set afterwards."""
    if not scale > 0:
        raise ValueError(f"scaled_gradients: scale must be > 0, got {scale!r}")
    seen: list[Tensor] = []
    hooks = [m.register_full_backward_hook(
        lambda m, grad_in, grad_out: seen.append(grad_out[0].detach().to(torch.float64)))
        for m in model.modules() if isinstance(m, nn.Linear)]
    model.zero_grad(set_to_none=True)
    device_type = next(model.parameters()).device.type
    try:
        with torch.autocast(device_type, dtype=autocast or torch.bfloat16,
                            enabled=autocast is not None):
            loss = loss_fn(model)
        (loss * scale).backward()
    finally:
        for h in hooks:
            h.remove()
    params = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p))
                        .detach().to(torch.float64).reshape(-1) for p in model.parameters()])
    acts = torch.cat([a.reshape(-1) for a in seen]) if seen else params.new_zeros(0)
    return Gradients(params=params / scale, activations=acts / scale)


def flushed(low: Tensor, reference: Tensor) -> int:
    """How many entries are exactly 0 in `low` but not in `reference` (same shape)."""
    if low.shape != reference.shape:
        raise ValueError(f"flushed: shapes differ, {tuple(low.shape)} and "
                         f"{tuple(reference.shape)}")
    return int(((low == 0) & (reference != 0)).sum().item())


__all__ = ["Gradients", "flushed", "scaled_gradients"]
