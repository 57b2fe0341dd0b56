"""A causal self-attention layer that runs one sequence slice by slice, for TeraPipe on ranks.

TeraPipe (Li et al., ICML 2021, section 3.1) pipelines the token slices of one sequence: slice j
reaches a stage while the stage still holds the keys and values of slices 0 … j − 1, and its
queries attend to all of them and to its own tokens up to their position. `SlicedAttention`
keeps that state: each call appends the slice's keys and values to a cache and attends to the
whole cache under a causal mask, so calling it on slices 0, 1, … in order gives exactly what one
call on the whole sequence gives (a residual block, x + W_o·attention(x)).

The cache holds the keys and values as autograd tensors of the earlier slices' graphs, so the
backward of slice j sends gradients into them, through slice i < j's projections, to slice i's
input and weights: why slice j's backward must run before slice i's (it adds to what slice i's
backward sends back) and why the stage keeps each slice's graph after its backward
(``retain_graph``). `toolkit.pipeline.compute` calls `start_sequence` before slice 0's forward.

Shapes: x is (tokens, d) for one sequence (the pipeline splits dim 0 into slices); heads h
divide d; scores per head (l, c + l) for a slice of l tokens after c cached ones.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..arguments import check_int


class SlicedAttention(nn.Module):
    """Causal multi-head self-attention with a residual, over the slices of one sequence."""

    def __init__(self, d: int, heads: int = 2, *, seed: int = 0,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        check_int("SlicedAttention", "d", d, hint="features per token")
        check_int("SlicedAttention", "heads", heads)
        if d % heads:
            raise ValueError(f"SlicedAttention: heads = {heads} must divide d = {d}")
        self.d, self.heads = d, heads
        gen = torch.Generator().manual_seed(seed)     # the same weights on every rank
        bound = 1.0 / math.sqrt(d)
        self.qkv = nn.Parameter((torch.rand(3 * d, d, generator=gen, device="cpu") * 2 - 1)
                                .mul_(bound).to(device))
        self.proj = nn.Parameter((torch.rand(d, d, generator=gen, device="cpu") * 2 - 1)
                                 .mul_(bound).to(device))
        self.start_sequence()

    def start_sequence(self) -> None:
        """Forget the cached keys and values: the next call is the sequence's first slice."""
        self._keys: list[Tensor] = []
        self._values: list[Tensor] = []

    def __getstate__(self) -> dict:
        # A copy (deepcopy, pickle to a spawned rank) starts a fresh sequence: the cache holds
        # tensors of this process's autograd graph, which neither can carry.
        state = dict(self.__dict__)
        state["_keys"], state["_values"] = [], []
        return state

    def forward(self, x: Tensor) -> Tensor:
        length, d = x.shape                                   # (l, d): one slice
        q, k, v = (x @ self.qkv.T).split(d, dim=-1)          # (l, d) each
        self._keys.append(k)
        self._values.append(v)
        keys, values = torch.cat(self._keys), torch.cat(self._values)   # (c + l, d)
        before = keys.shape[0] - length
        hd = d // self.heads

        def heads(t: Tensor) -> Tensor:                       # (n, d) -> (h, n, hd)
            return t.view(t.shape[0], self.heads, hd).transpose(0, 1)

        scores = heads(q) @ heads(keys).transpose(1, 2) / math.sqrt(hd)   # (h, l, c + l)
        # Token i of the slice sits at position c + i and sees keys 0 … c + i.
        seen = torch.ones(length, before + length, dtype=torch.bool, device=x.device)
        scores = scores.masked_fill(~seen.tril(diagonal=before), float("-inf"))
        mixed = (scores.softmax(dim=-1) @ heads(values)).transpose(0, 1).reshape(length, d)
        return x + mixed @ self.proj.T

    def extra_repr(self) -> str:
        return f"d={self.d}, heads={self.heads}, cached tokens={sum(map(len, self._keys))}"


__all__ = ["SlicedAttention"]
