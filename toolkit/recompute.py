"""Activation checkpointing (recomputation) on `TinyGPT`: memory saved, time paid, √L rule.

Sources: Chen, Xu, Zhang & Guestrin, 2016, "Training Deep Nets with Sublinear Memory Cost"
(arXiv:1604.06174), sections 3-4; Korthikanti et al., 2022, "Reducing Activation Recomputation
in Large Transformer Models" (arXiv:2205.05198), section 4 (full recomputation keeps only each
layer's input, 2·s·b·h bytes in 16-bit).

Backward needs tensors that forward computed (a matmul's input, a softmax's output, ...); autograd
keeps them from forward to backward, and for a transformer they dwarf the weights. Checkpointing a
segment of k blocks keeps only the segment's input; backward runs the segment's forward again to
get the rest back, then its backward. With L blocks in segments of k:

    memory ≈ ⌈L/k⌉ segment inputs (held all along)  +  k blocks' internals (one segment at a time)

which is smallest at k = √L when an input costs as much as a block's internals: O(√L) instead
of O(L), for one extra forward per step (Chen et al., section 4). A transformer block keeps far
more inside (Korthikanti: 34·s·b·h + 5·a·s²·b bytes) than its input (2·s·b·h), so there the best
k is about √(L·input/internals), often 1: checkpoint every block (`best_every` computes it).
Gradients are unchanged: the recomputed forward is the same arithmetic (no dropout here;
`torch.utils.checkpoint` would replay the RNG state anyway).

This module measures rather than asserts: `saved_bytes` counts the bytes autograd keeps for
backward (with `torch.autograd.graph.saved_tensors_hooks`, each storage once, parameters left
out), and `measure` adds the time of forward and backward, so the extra forward shows.

    model = CheckpointedGPT(TinyGPT(GPTConfig(n_layer=16)), every=4)   # 4 segments of 4
    logits, loss = model(x, y)                                         # as TinyGPT
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .arguments import check_int
from .models import TinyGPT

__all__ = ["CheckpointedGPT", "StepMeasure", "best_every", "chen_memory", "measure",
           "saved_bytes", "segment_sizes"]


def segment_sizes(n_layer: int, every: int | None) -> list[int]:
    """Blocks per checkpointed segment, in order; ``[]`` for ``every=None`` (no checkpointing).

    ``every=k`` groups consecutive blocks k at a time (the last segment may be shorter).
    """
    if every is None:
        return []
    check_int("", "every", every, expected="None (no checkpointing) or an int >= 1 (blocks per "
                                           "checkpointed segment)")
    return [min(every, n_layer - i) for i in range(0, n_layer, every)]


def chen_memory(n_layer: int, every: int | None, *, input_bytes: float = 1.0,
                block_bytes: float = 1.0) -> float:
    """Peak activation memory of L blocks checkpointed in segments of `every` (Chen et al.).

    No checkpointing: L·c, every block's internals c = `block_bytes`. Segments of k: ⌈L/k⌉ segment
    inputs of a = `input_bytes` each, held all along, plus one segment's k blocks of internals
    rerun during its backward: ⌈L/k⌉·a + k·c. In Chen's units (a = c = 1) that is ⌈L/k⌉ + k,
    smallest near k = √L. Leaves out what lies outside the blocks (embeddings, head, loss).
    """
    if every is None:
        return n_layer * block_bytes
    return len(segment_sizes(n_layer, every)) * input_bytes + min(every, n_layer) * block_bytes


def best_every(n_layer: int, *, input_bytes: float = 1.0, block_bytes: float = 1.0) -> int:
    """The segment length k with the least `chen_memory`: √L when an input costs as much as a
    block's internals (Chen et al., section 4), about √(L·a/c) in general."""
    check_int("best_every", "n_layer", n_layer)
    return min(range(1, n_layer + 1), key=lambda k: (
        chen_memory(n_layer, k, input_bytes=input_bytes, block_bytes=block_bytes),
        abs(k - math.sqrt(n_layer * input_bytes / block_bytes))))


class CheckpointedGPT(nn.Module):
    """`TinyGPT` whose blocks run in checkpointed segments of ``every`` blocks.

    The same parameters as ``module`` (not copies), the same forward and the same gradients;
    only what autograd keeps changes. ``every=None`` runs the blocks plainly.
    """

    def __init__(self, module: TinyGPT, *, every: int | None = 1) -> None:
        super().__init__()
        if not isinstance(module, TinyGPT):
            raise TypeError(f"CheckpointedGPT wraps a TinyGPT, got {type(module).__name__}")
        self.module, self.every = module, every
        self.segments = segment_sizes(len(module.blocks), every)

    def _segment(self, start: int, stop: int) -> Callable[[Tensor], Tensor]:
        def run(x: Tensor) -> Tensor:
            for block in self.module.blocks[start:stop]:
                x = block(x)  # (b, s, h) -> (b, s, h)
            return x
        return run

    def forward(self, idx: Tensor, targets: Tensor | None = None
                ) -> tuple[Tensor, Tensor | None]:
        m = self.module
        b, s = idx.shape
        if s > m.cfg.seq_len:
            raise ValueError(f"CheckpointedGPT: sequence length {s} exceeds cfg.seq_len="
                             f"{m.cfg.seq_len}")
        x = m.drop(m.tok_emb(idx) + m.pos_emb(torch.arange(s, device=idx.device)))
        if self.every is None:
            x = self._segment(0, len(m.blocks))(x)
        else:
            start = 0
            for n in self.segments:
                # Non-reentrant checkpoint (PyTorch's recommended form): keeps x, drops the rest,
                # reruns the segment inside backward.
                x = checkpoint(self._segment(start, start + n), x, use_reentrant=False)
                start += n
        logits = m.lm_head(m.ln_f(x))  # (b, s, h) @ (h, V) -> (b, s, V)
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.reshape(b * s, -1), targets.reshape(b * s))


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
    """One training step of a (possibly checkpointed) TinyGPT, measured."""

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
        """Chen et al.'s estimate of the activation peak: saved + one segment rerun."""
        return self.saved_bytes + self.segment_bytes


def measure(model: TinyGPT, idx: Tensor, targets: Tensor, *, every: int | None,
            repeats: int = 3) -> StepMeasure:
    """Saved bytes, forward and backward time, and gradients of one step with ``every``.

    Timing keeps the best of `repeats` (a busy machine only ever adds time).
    """
    ck = CheckpointedGPT(model, every=every)
    fwd, bwd, saved = math.inf, math.inf, 0
    for _ in range(max(1, repeats)):
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        (_, loss), saved = saved_bytes(lambda: ck(idx, targets),
                                       exclude=list(model.parameters()))
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        fwd, bwd = min(fwd, t1 - t0), min(bwd, t2 - t1)
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    segment = 0
    if every is not None:  # what the biggest segment saves when it runs plainly in backward
        # Zeros: only sizes matter here, and the global RNG stays untouched.
        x = torch.zeros(idx.shape[0], idx.shape[1], model.cfg.d_model, requires_grad=True)
        # Its input is left out: that is the checkpoint's, already in saved_bytes.
        _, segment = saved_bytes(lambda: ck._segment(0, max(ck.segments))(x),
                                 exclude=[*model.parameters(), x])
    model.zero_grad(set_to_none=True)
    return StepMeasure(every, saved, segment, fwd, bwd, grads)
