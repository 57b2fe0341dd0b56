"""Why slicing the ring helps: the α-β model with the adds in it (an α-β-γ model).

The α-β model (`toolkit.cost.models`) has no term for computation, so in it the simple ring and
the sliced ring cost the same. Add γ, seconds per byte of a local reduction (acc ← acc ⊕ x), and
look at one reduce-scatter step of a ring all-reduce on p ranks, n bytes, chunks of n/p:

* **simple ring**: receive the whole chunk, then add it: α + (n/p)·β + (n/p)·γ. Nothing overlaps.
* **sliced ring**, S slices of n/(pS): slice k+1 is on the wire while slice k is added, so the
  step costs S·α + (n/p)·β + (n/(pS))·γ: every message pays α, and only the last slice's add is
  exposed (assuming a slice is added faster than it arrives, γ ≤ β + α·pS/n).

Over the 2(p−1) steps of an all-reduce (p−1 of them add; the all-gather only copies):

    t(S) = 2(p−1)·S·α + 2(p−1)/p·n·β + (p−1)/p·n·γ / S          (S = 1: the simple ring)

dt/dS = 0 gives the best slice count S* = √(n·γ / (2p·α)): more slices hide more of the adds but
pay more latency. It grows only as √n, so a large α (processes waking up on a busy CPU) favours
few slices; a small one (NCCL on NVLink) many. The step-by-step view ignores that the pipeline
also runs across steps (a slice is forwarded before its chunk is complete), so t(S) is an upper
bound; lesson 03 sets it beside measurements. The same algebra gives the reduce-scatter (half the
α and β terms, all of the adds) and the all-gather (no adds: slicing only costs α in this model).

References: Patarasuk & Yuan, JPDC 2009 (the ring); gloo `allreduce.cc` and NCCL's slices/steps
(NCCL 2.x, `ncclProto`) for pipelining a chunk. Pure functions: numbers in, numbers out.
"""

from __future__ import annotations

import math

import numpy as np

from .models import AlphaBeta

_ADDS = {"all_reduce": 1.0, "reduce_scatter": 1.0, "all_gather": 0.0}  # × (p−1)/p·n·γ
_HALVES = {"all_reduce": 2.0, "reduce_scatter": 1.0, "all_gather": 1.0}  # × (p−1) steps


def _check(collective: str, p: int, slices, gamma: float) -> None:
    if collective not in _ADDS:
        raise ValueError(f"sliced ring model: collective must be one of {', '.join(_ADDS)}, "
                         f"got {collective!r}")
    if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or p < 1:
        raise ValueError(f"sliced ring model: p must be an int >= 1, got {p!r}")
    if np.any(np.asarray(slices) < 1):
        raise ValueError(f"sliced ring model: slices must be >= 1, got {slices!r}")
    if not gamma >= 0:
        raise ValueError(f"sliced ring model: gamma (seconds per byte added) must be >= 0, "
                         f"got {gamma!r}")


def sliced_ring_time(nbytes, p: int, link: AlphaBeta, *, gamma: float, slices=1,
                     collective: str = "all_reduce"):
    """t(S) above, seconds, for n = `nbytes` and S = `slices` (numbers or numpy arrays)."""
    _check(collective, p, slices, gamma)
    n, s = np.asarray(nbytes, dtype=float), np.asarray(slices, dtype=float)
    steps = _HALVES[collective] * (p - 1)
    return (steps * s * link.alpha + steps / p * n * link.beta
            + _ADDS[collective] * (p - 1) / p * n * gamma / s)


def best_slices(nbytes: float, p: int, link: AlphaBeta, *, gamma: float,
                collective: str = "all_reduce") -> int:
    """The whole S ≥ 1 that minimises `sliced_ring_time` (S* = √(n·γ/(2p·α)) for all-reduce)."""
    _check(collective, p, 1, gamma)
    if link.alpha <= 0:
        raise ValueError("best_slices: with α = 0 more slices always help; give α > 0")
    if _ADDS[collective] == 0:
        return 1
    steps = _HALVES[collective] * (p - 1)
    # t(S) = steps·α·S + c/S with c = (p−1)/p·n·γ: minimum at √(c / (steps·α)).
    star = math.sqrt((p - 1) / p * nbytes * gamma / (steps * link.alpha)) if p > 1 else 1.0
    candidates = {max(1, math.floor(star)), max(1, math.ceil(star))}
    return min(candidates, key=lambda s: float(sliced_ring_time(nbytes, p, link, gamma=gamma,
                                                                slices=s, collective=collective)))


def slicing_speedup(nbytes, p: int, link: AlphaBeta, *, gamma: float, slices,
                    collective: str = "all_reduce"):
    """t(1) / t(S): how much faster S slices are than the simple ring, in this model."""
    one = sliced_ring_time(nbytes, p, link, gamma=gamma, slices=1, collective=collective)
    return one / sliced_ring_time(nbytes, p, link, gamma=gamma, slices=slices,
                                  collective=collective)
