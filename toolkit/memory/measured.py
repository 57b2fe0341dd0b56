"""Bytes of model states a process actually holds, counted from its tensors' storages.

The check on `model_state_bytes`: after a training step, walk the parameters, their gradients
and the optimizer's state, and add up the bytes of every distinct storage (views of one flat
buffer count once, a freed storage counts 0). Parameters are found in the module, in the
optimizer's param groups and as keys of its state (a sharded optimizer steps on shard views);
a wrapper that keeps other parameter storage (FSDP's gathered buffers) lists it in a method
``unsharded_tensors()``.

torch's Adam keeps a 0-dim ``step`` tensor per parameter it updates: 4 bytes of bookkeeping that
no memory model counts. They are left out of ``optimizer`` and returned in ``step_bytes``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch
from torch import nn

from .states import ModelStates


@dataclass(frozen=True)
class Held(ModelStates):
    """`ModelStates` measured on one rank, plus the optimizer's scalar step counters."""

    step_bytes: int = 0
    """Bytes of 0-dim optimizer state tensors (Adam's ``step``), not part of ``optimizer``."""


def storage_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes of the distinct storages behind `tensors` (views of one buffer count once; a
    DTensor counts its local shard's storage)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        if hasattr(t, "to_local"):  # a DTensor (torch FSDP2): this rank's local shard
            t = t.to_local()
        storage = t.untyped_storage()
        if storage.nbytes():
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def held_model_states(module: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> Held:
    """Bytes of parameters, gradients and optimizer state held by this process (module
    docstring), as a `Held` (a `ModelStates` with ``step_bytes``)."""
    params: list[torch.Tensor] = list(module.parameters())
    extra = getattr(module, "unsharded_tensors", None)
    if callable(extra):
        params += list(extra())
    state_tensors: list[torch.Tensor] = []
    steps: list[torch.Tensor] = []
    if optimizer is not None:
        for group in optimizer.param_groups:
            params += list(group["params"])
        for key, state in optimizer.state.items():
            if isinstance(key, torch.Tensor):
                params.append(key)
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    (steps if value.dim() == 0 else state_tensors).append(value)
    grads = [p.grad for p in params]
    return Held(params=storage_bytes(params), grads=storage_bytes(grads),
                optimizer=storage_bytes(state_tensors),
                step_bytes=sum(t.numel() * t.element_size() for t in steps))


__all__ = ["Held", "held_model_states", "storage_bytes"]
