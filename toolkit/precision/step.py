"""A data-parallel mixed-precision step: 16-bit gradients all-reduced in a chosen dtype.

Data parallelism (lesson 04) averages the gradients with one all-reduce per step; a ring sends
2(N−1)/N of the buffer per rank (Patarasuk & Yuan 2009), so the bytes on the wire are
2(N−1)/N · Ψ · (bytes per element): bf16 gradients send half of what fp32 ones send. That
halving needs gradients kept (or cast) in 16 bits: 16-bit working parameters as here and in
Megatron-LM / DeepSpeed, a compression hook on DDP (`fp16_compress_hook`), or FSDP's
``reduce_dtype``. Standard AMP (fp32 parameters under `torch.autocast`) leaves ``param.grad`` in
fp32, and DDP all-reduces those 4 bytes per parameter (lesson 05 records both). The catch
is accuracy: a ring adds the N contributions one by one in the dtype on the wire, so a bf16
reduction rounds N − 1 times to 8 significant bits (`toolkit.formats.sequential_sum` shows
where that goes). Reducing in fp32 costs twice the bytes and rounds once, when the result is
cast back (what FSDP's ``reduce_dtype=torch.float32`` and Megatron's fp32 main gradients do).

One step (`data_parallel_step`), every rank:

    loss = loss_fn(model)                      forward (16-bit weights, or fp32 under autocast)
    scaler.scale(loss).backward()              16-bit gradients, times the loss scale s
    all_reduce_gradients(..., dtype)           one flat all-reduce of the mean, in `dtype`
    scaler.step(optimizer); scaler.update()    unscale into fp32 masters, inf/NaN check on all
                                               ranks, step or skip on every rank alike

The flat buffer is divided by N before the sum (as PyTorch DDP does), so a scaled fp16
gradient cannot overflow in the sum where each addend is finite.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch
import torch.distributed as dist
from torch import Tensor, nn

from .scaler import DynamicLossScaler


@torch.no_grad()
def all_reduce_gradients(params: Iterable[Tensor], *, dtype: torch.dtype | None = None,
                         group: Any = None) -> None:
    """Average the gradients of `params` over the ranks of `group` with one all-reduce of a
    flat buffer in `dtype` (None: the gradients' own dtype), written back into each ``.grad``
    in its own dtype. A trainable parameter without a gradient contributes zeros (every rank
    sends the same buffer) and receives the mean; frozen parameters are left out.

    Bytes a rank passes to the all-reduce: Ψ · (bytes of `dtype`); the ring sends 2(N−1)/N
    of that (module docstring)."""
    if not dist.is_initialized():
        raise RuntimeError("all_reduce_gradients: torch.distributed is not initialised (run "
                           "inside toolkit.launch.spawn)")
    params = [p for p in params if p.requires_grad]
    if not params:
        return
    dtype = dtype or next((p.grad.dtype for p in params if p.grad is not None), params[0].dtype)
    if not dtype.is_floating_point:
        raise ValueError(f"all_reduce_gradients: dtype must be a floating dtype, got {dtype}")
    world = dist.get_world_size(group)
    device = params[0].device
    flat = torch.empty(sum(p.numel() for p in params), dtype=dtype, device=device)
    offset = 0
    for p in params:
        window = flat[offset:offset + p.numel()]
        if p.grad is None:
            window.zero_()
        else:
            window.copy_(p.grad.reshape(-1))  # cast into the dtype on the wire
        offset += p.numel()
    flat.div_(world)  # the mean, divided before the sum (see the module docstring)
    dist.all_reduce(flat, group=group)
    offset = 0
    for p in params:
        mean = flat[offset:offset + p.numel()].view_as(p)
        if p.grad is None:
            p.grad = mean.to(p.dtype, copy=True)
        else:
            p.grad.copy_(mean)
        offset += p.numel()


@dataclass(frozen=True)
class StepResult:
    """What one `data_parallel_step` did on this rank."""

    loss: float
    """This rank's (unscaled) loss."""
    stepped: bool
    """False when the step was skipped (some rank found an inf/NaN gradient)."""
    scale: float
    """The loss scale used in this step (before `update`)."""


def data_parallel_step(model: nn.Module, optimizer: torch.optim.Optimizer,
                       loss_fn: Callable[[nn.Module], Tensor], *,
                       scaler: DynamicLossScaler | None = None,
                       reduce_dtype: torch.dtype | None = torch.bfloat16,
                       group: Any = None) -> StepResult:
    """One mixed-precision data-parallel step on this rank (module docstring): `loss_fn(model)`
    returns this rank's loss on its share of the batch; gradients are all-reduced in
    `reduce_dtype` (None: their own dtype); `scaler` None means no loss scaling (bf16)."""
    optimizer.zero_grad()
    loss = loss_fn(model)
    scale = scaler.scale_value if scaler is not None else 1.0
    (scaler.scale(loss) if scaler is not None else loss).backward()
    all_reduce_gradients(model.parameters(), dtype=reduce_dtype, group=group)
    if scaler is None:
        optimizer.step()
        return StepResult(loss=float(loss), stepped=True, scale=scale)
    stepped = scaler.step(optimizer)
    scaler.update()
    return StepResult(loss=float(loss), stepped=stepped, scale=scale)


__all__ = ["StepResult", "all_reduce_gradients", "data_parallel_step"]
