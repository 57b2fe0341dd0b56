"""Measuring checkpointing: the bytes autograd keeps, the time and FLOPs a step takes.

`saved_bytes` counts what autograd keeps from forward to backward with
`torch.autograd.graph.saved_tensors_hooks` (each storage once, parameters left out). The peak of
activation memory during a checkpointed step is Chen et al.'s two terms, each measured: what
forward kept (every segment's input, plus what lies outside the segments), plus what one segment
keeps while it is rerun in backward (`StepMeasure.peak_bytes`). `measure` adds forward and
backward time, so the extra forward shows; `toolkit.experiments.recompute.sweep` runs every case
on several CPU ranks at once (each rank a whole step of its own, no communication) and adds FLOPs
counted by `torch.utils.flop_counter.FlopCounterMode` on rank 0.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
from torch import Tensor

from ..models import TinyGPT, TinyMLP
from .wrappers import CheckpointedGPT, CheckpointedMLP

__all__ = ["StepMeasure", "checkpointed", "measure", "saved_bytes"]


def saved_bytes(fn: Callable[[], Tensor], *, exclude: Iterable[Tensor] = ()
                ) -> tuple[Tensor, int]:
    """Run ``fn()`` (a forward) and count the bytes autograd saved for backward.

    Returns (fn's result, bytes). Each storage counts once (a tensor and its views, or one tensor
    saved by two ops, are one allocation); storages of the tensors in `exclude` are left out
    (pass the model's parameters: a matmul saves its weight, which is not an activation).
    """
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in skip:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(seen.values())


@dataclass(frozen=True)
class StepMeasure:
    """One training step of a (possibly checkpointed) TinyGPT or TinyMLP, measured."""

    every: int | None
    """Blocks per checkpointed segment (None: no checkpointing)."""
    saved_bytes: int
    """Bytes autograd holds from the end of forward until backward (parameters excluded)."""
    segment_bytes: int
    """Bytes one segment's forward saves when rerun in backward (0 without checkpointing): the
    extra memory at the peak of backward."""
    forward_s: float
    """Seconds of forward (best of the repeats)."""
    backward_s: float
    """Seconds of backward, including any recomputed forward (best of the repeats)."""
    grads: dict[str, Tensor]
    """Parameter gradients of the step, by name (to compare with and without checkpointing)."""

    @property
    def peak_bytes(self) -> int:
        """The activation peak by Chen et al.'s two terms, each measured: saved + one segment
        rerun."""
        return self.saved_bytes + self.segment_bytes


def checkpointed(model: TinyGPT | TinyMLP, *, every: int | None, selective: bool = False,
                 attention: str = "materialised") -> CheckpointedGPT | CheckpointedMLP:
    """The checkpointing wrapper for `model` (`selective` and `attention` for TinyGPT only)."""
    if isinstance(model, TinyGPT):
        return CheckpointedGPT(model, every=every, selective=selective, attention=attention)
    if isinstance(model, TinyMLP):
        if selective or attention != "materialised":
            raise ValueError("checkpointed: selective and attention apply to a TinyGPT only")
        return CheckpointedMLP(model, every=every)
    raise TypeError(f"checkpointed: model must be a TinyGPT or a TinyMLP, "
                    f"got {type(model).__name__}")


def measure(model: TinyGPT | TinyMLP, inputs: Tensor, targets: Tensor, *, every: int | None,
            selective: bool = False, attention: str = "materialised",
            repeats: int = 3) -> StepMeasure:
    """Saved bytes, forward and backward time, and gradients of one step with ``every`` (and,
    for a TinyGPT, ``selective`` / ``attention``; see `CheckpointedGPT`).

    Timing keeps the best of `repeats` (a busy machine only ever adds time).
    """
    ck = checkpointed(model, every=every, selective=selective, attention=attention)
    fwd, bwd, saved = math.inf, math.inf, 0
    for _ in range(max(1, repeats)):
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        (_, loss), saved = saved_bytes(lambda: ck(inputs, targets),
                                       exclude=list(model.parameters()))
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        fwd, bwd = min(fwd, t1 - t0), min(bwd, t2 - t1)
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    segment = 0
    if every is not None:  # what the biggest segment saves when it runs plainly in backward
        # Zeros: only sizes matter here, and the global RNG stays untouched.
        x = ck.block_input(inputs).requires_grad_()
        # Its input is left out: that is the checkpoint's, already in saved_bytes.
        _, segment = saved_bytes(lambda: ck.segment(0, max(ck.segments))(x),
                                 exclude=[*model.parameters(), x])
    model.zero_grad(set_to_none=True)
    return StepMeasure(every, saved, segment, fwd, bwd, grads)
