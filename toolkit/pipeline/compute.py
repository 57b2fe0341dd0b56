"""What one pipeline rank computes per op: F, B (the whole backward, or only its input
gradient), W (the weight gradients), and the bytes of activations it holds meanwhile.

F runs a chunk on its input and keeps what the backward needs. Without W ops, B is one
``torch.autograd.backward`` through the chunk: dL/d(input) and every weight gradient. With W ops
(the backward split of Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, section 2):

* during F, a forward hook on every module that owns trainable parameters notes where its
  output sits in the autograd graph (a ``GradientEdge``, which an in-place op on the output
  later cannot move);
* B is ``torch.autograd.grad(out, [input, *those outputs], grad, retain_graph=True)``: autograd
  computes only what leads to the requested tensors, so the gradient flows back to the input
  and *through* every layer (dL/dY of each weight layer is on that path) but no dL/dW is formed;
  the input's gradient goes to the previous stage, the dL/dY are kept;
* W is, per weight module, ``torch.autograd.backward(its output edge, its dL/dY,
  inputs=its own parameters)``: each layer's weight gradient from the dL/dY kept at B and the
  inputs the forward saved (a Linear's dW = dYᵀ·X), accumulated into ``.grad``. Nothing of B is
  computed twice.

The memory this costs: between B and W a micro-batch holds the whole graph its forward built
(``retain_graph``: the saved tensors cannot be freed at B, as a plain backward would) *plus*
the dL/dY of every weight layer, one tensor the size of each layer's output. The paper keeps
only what W needs (M_W = 32·s·b·h per transformer layer against M_B for the whole backward,
Table 1) by splitting each layer's backward by hand; a generic module cannot. Counted here: the
bytes autograd saves during F (a ``saved_tensors_hooks`` pack hook; parameters left out, each
tensor once) are held from F until B (unsplit) or W (split), and the kept dL/dY from B to W.

Token slices of one sequence (TeraPipe) share state between ops: a layer that keeps the keys
and values of earlier slices (`toolkit.pipeline.token_layers.SlicedAttention`) is told
``start_sequence()`` before slice 0's forward, and the backwards retain the graph, since a later
slice's backward runs through the earlier slices' parts of it.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import Tensor, nn
from torch.autograd.graph import GradientEdge, get_gradient_edge

from .schedules import Op

LossFn = Callable[[Tensor, Tensor], Tensor]


def _tensors(out: object) -> list[Tensor]:
    """The tensors of a module's output (a tensor, or a tuple / list of them)."""
    if isinstance(out, Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for t in out if isinstance(t, Tensor)]
    return []


def _nbytes(tensors: Sequence[Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class StageCompute:
    """One rank's chunks, its micro-batches, and what each forward left for its backward."""

    def __init__(self, chunks: Sequence[nn.Module], params: Sequence[nn.Parameter], x: Tensor,
                 y: Tensor, m: int, loss_fn: LossFn, last: int, *, split: bool,
                 retain: bool = False) -> None:
        self.chunks = list(chunks)
        self.param_ptrs = {prm.untyped_storage().data_ptr() for prm in params}
        self.micro_x, self.micro_y = torch.tensor_split(x, m), torch.tensor_split(y, m)
        self.rows, self.loss_fn, self.last = len(x), loss_fn, last
        self.split, self.retain = split, retain
        # Modules whose own (not their children's) trainable parameters W must reach.
        self.weight_modules = [[mod for mod in chunk.modules()
                                if any(q.requires_grad for q in mod.parameters(recurse=False))]
                               for chunk in self.chunks]
        self.stash: dict[tuple[int, int], tuple[Tensor | None, Tensor]] = {}
        self.outputs: dict[tuple[int, int], list[tuple[nn.Module, GradientEdge]]] = {}
        self.pending: dict[tuple[int, int], list[tuple[nn.Module, GradientEdge, Tensor]]] = {}
        self.mb_bytes: dict[tuple[int, int], int] = {}
        self.grad_bytes: dict[tuple[int, int], int] = {}
        self.held = self.peak = 0
        self.loss = 0.0

    def _hold(self, nbytes: int) -> None:
        self.held += nbytes
        self.peak = max(self.peak, self.held)

    def forward(self, op: Op, k: int, received: Tensor | None) -> Tensor:
        """Run chunk `op.chunk` on its input (x's micro-batch at position 0); returns the output
        (the scaled loss at the last position), keeps what backward needs."""
        inp = self.micro_x[op.mb] if k == 0 else received.requires_grad_()
        if self.retain and op.mb == 0:      # a sequence's first slice: forget earlier state
            for mod in self.chunks[op.chunk].modules():
                if callable(getattr(mod, "start_sequence", None)):
                    mod.start_sequence()
        seen: set[tuple[int, int]] = set()
        saved = 0
        outputs: list[tuple[nn.Module, GradientEdge]] = []

        def pack(t: Tensor) -> Tensor:
            # The tensor's own bytes, not its storage's: a micro-batch of x is a view into the
            # whole batch. Once per tensor (a ReLU's output is the next Linear's input).
            nonlocal saved
            key = (t.data_ptr(), t.numel())
            if t.untyped_storage().data_ptr() not in self.param_ptrs and key not in seen:
                seen.add(key)
                saved += t.numel() * t.element_size()
            return t

        def note(mod: nn.Module, args: object, out: object) -> None:
            for t in _tensors(out):
                if t.requires_grad and t.grad_fn is not None:
                    outputs.append((mod, get_gradient_edge(t)))

        hooks = ([mod.register_forward_hook(note) for mod in self.weight_modules[op.chunk]]
                 if self.split else [])
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = self.chunks[op.chunk](inp)
                if k == self.last:  # the loss, weighted by this micro-batch's share of rows
                    share = len(self.micro_x[op.mb]) / self.rows
                    out = self.loss_fn(out, self.micro_y[op.mb]) * share
                    self.loss += float(out.detach())
        finally:
            for hook in hooks:
                hook.remove()
        key = (op.mb, op.chunk)
        self.stash[key] = (inp if k > 0 else None, out)
        self.outputs[key] = outputs
        self.mb_bytes[key] = saved
        self._hold(saved)
        return out

    def backward(self, op: Op, grad: Tensor | None) -> Tensor | None:
        """The whole backward of `op.chunk` for micro-batch `op.mb`; returns dL/d(input) (None
        at position 0, whose input is data) and frees the forward's saved activations."""
        inp, out = self.stash.pop((op.mb, op.chunk))
        self.outputs.pop((op.mb, op.chunk))
        if out.requires_grad:       # a stage of frozen layers on data has nothing to backprop
            torch.autograd.backward(out, grad, retain_graph=self.retain)
        self.held -= self.mb_bytes[op.mb, op.chunk]
        if inp is None:
            return None
        return inp.grad if inp.grad is not None else torch.zeros_like(inp)

    def backward_input(self, op: Op, grad: Tensor | None) -> Tensor | None:
        """B of a split backward: dL/d(input) (None at position 0), and the dL/dY of every
        weight module kept for `backward_weight`; nothing is freed yet."""
        key = (op.mb, op.chunk)
        inp, out = self.stash[key]
        edges = self.outputs.pop(key)
        targets: list[Tensor | GradientEdge] = ([inp] if inp is not None else [])
        targets += [edge for _, edge in edges]
        grads: Sequence[Tensor | None] = [None] * len(targets)
        if out.requires_grad and targets:
            grads = torch.autograd.grad(out, targets, grad, retain_graph=True,
                                        allow_unused=True)
        first = 1 if inp is not None else 0
        kept = [(mod, edge, g) for (mod, edge), g in zip(edges, grads[first:]) if g is not None]
        self.pending[key] = kept
        self.grad_bytes[key] = _nbytes([g for _, _, g in kept])
        self._hold(self.grad_bytes[key])
        if inp is None:
            return None
        return grads[0] if grads[0] is not None else torch.zeros_like(inp)

    def backward_weight(self, op: Op) -> None:
        """W: every weight module's parameter gradients from the dL/dY kept at B, accumulated
        into ``.grad``; then the micro-batch's graph and kept gradients are freed."""
        key = (op.mb, op.chunk)
        for mod, edge, g in self.pending.pop(key):
            own = [q for q in mod.parameters(recurse=False) if q.requires_grad]
            torch.autograd.backward(edge, g, inputs=own, retain_graph=True)
        self.stash.pop(key)                  # the last references to this micro-batch's graph
        self.held -= self.mb_bytes[key] + self.grad_bytes[key]


__all__ = ["LossFn", "StageCompute"]
