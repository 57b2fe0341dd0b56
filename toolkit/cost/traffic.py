"""Bytes per step of three ways to communicate less than DDP, and what they save on a link.

Counted as the recorder counts a collective (`toolkit.comm`): the bytes a rank *passes in*.
A ring all-reduce of n such bytes then sends 2(p−1)/p·n per rank (lesson 02).

* DDP all-reduces every gradient every step: Ψ elements (Li et al., VLDB 2020).
* Local SGD / DiLoCo (Stich, ICLR 2019; Lin et al., ICLR 2020; Douillard et al. 2023,
  Algorithm 1) all-reduce Ψ elements once every H steps: Ψ/H per step on average.
* PowerSGD (Vogels et al., NeurIPS 2019, Algorithm 1) sends, for a gradient reshaped to an
  n × m matrix, P (n × r) and Q (m × r): r·(n + m) elements instead of n·m. A matrix is
  compressed only if r·(n + m)·rate < n·m (torch's ``min_compression_rate``, default 2);
  vectors and the rest go uncompressed.

Pure functions: numbers in, numbers out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

from ..arguments import check_int, check_positive
from .models import AlphaBeta, predict

__all__ = ["PowerSGDVolume", "compresses", "ddp_bytes", "local_sgd_bytes", "matrix_shape",
           "powersgd_elements", "sync_time_per_step"]


def ddp_bytes(n_params: int, *, steps: int = 1, bytes_per_element: int = 4) -> int:
    """Bytes a DDP rank passes to all-reduce in ``steps`` steps: Ψ·b per step."""
    check_int("ddp_bytes", "n_params", n_params, low=0)
    check_int("ddp_bytes", "steps", steps, low=0)
    check_int("ddp_bytes", "bytes_per_element", bytes_per_element)
    return n_params * bytes_per_element * steps


def local_sgd_bytes(n_params: int, *, steps: int, sync_every: int,
                    bytes_per_element: int = 4) -> int:
    """Bytes a local-SGD or DiLoCo rank passes to all-reduce in ``steps`` steps when it
    synchronises after every ``sync_every``-th: ⌊steps/H⌋ all-reduces of Ψ·b bytes."""
    check_int("local_sgd_bytes", "sync_every", sync_every, hint="H")
    return ddp_bytes(n_params, steps=steps // sync_every, bytes_per_element=bytes_per_element)


def compresses(n: int, m: int, rank: int, *, min_compression_rate: float = 2.0) -> bool:
    """Whether PowerSGD compresses an n × m matrix at rank r: r·(n + m)·rate < n·m."""
    check_int("compresses", "rank", rank)
    check_positive("compresses", "min_compression_rate", min_compression_rate)
    return rank * (n + m) * min_compression_rate < n * m


def matrix_shape(shape: Sequence[int]) -> tuple[int, int] | None:
    """(n, m) of the matrix a gradient of ``shape`` becomes (first dimension × the rest), or
    None for a scalar or vector (never compressed)."""
    if len(shape) < 2:
        return None
    n = int(shape[0])
    return n, math.prod(int(s) for s in shape[1:])


@dataclass(frozen=True)
class PowerSGDVolume:
    """Elements one rank passes to all-reduce per step under PowerSGD, and without it."""

    p: int
    """Σ r·n over the compressed matrices (the P all-reduce)."""
    q: int
    """Σ r·m over the compressed matrices (the Q all-reduce)."""
    uncompressed: int
    """Elements of every tensor sent as is (vectors, matrices not worth compressing)."""
    dense: int
    """Elements DDP would send: every gradient, Ψ."""

    @property
    def total(self) -> int:
        """r·(n + m) summed over compressed matrices, plus the uncompressed elements."""
        return self.p + self.q + self.uncompressed

    @property
    def ratio(self) -> float:
        """Dense elements per element sent (the compression ratio)."""
        return self.dense / self.total if self.total else math.inf


def powersgd_elements(shapes: Iterable[Sequence[int]], rank: int, *,
                      min_compression_rate: float = 2.0) -> PowerSGDVolume:
    """The `PowerSGDVolume` of gradients of these ``shapes`` at rank r (``min(r, n, m)`` per
    matrix, as the hooks use)."""
    check_int("powersgd_elements", "rank", rank)
    p = q = flat = dense = 0
    for shape in shapes:
        numel = math.prod(int(s) for s in shape)
        dense += numel
        nm = matrix_shape(shape)
        if nm is not None and compresses(*nm, rank, min_compression_rate=min_compression_rate):
            r = min(rank, *nm)
            p += r * nm[0]
            q += r * nm[1]
        else:
            flat += numel
    return PowerSGDVolume(p=p, q=q, uncompressed=flat, dense=dense)


def sync_time_per_step(nbytes: float, p: int, link: AlphaBeta, *, sync_every: int = 1) -> float:
    """Seconds of ring all-reduce per training step when ``nbytes`` are all-reduced once every
    ``sync_every`` steps: (2(p−1)α + 2(p−1)/p·n·β) / H (Thakur et al. 2005)."""
    check_int("sync_time_per_step", "sync_every", sync_every, hint="H")
    return float(predict("all_reduce", "ring", nbytes, p, link)) / sync_every
