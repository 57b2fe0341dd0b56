"""α-β cost of every collective algorithm in `toolkit.collectives`, and nccl-tests bandwidths.

The α-β (Hockney) model charges α seconds per message and β seconds per byte; an algorithm that
needs `a` message rounds and moves `b·n` bytes on its busiest path takes

    t = a·α + b·n·β          (n: bytes of the full tensor, as nccl-tests counts "size")

so every model here is the pair of coefficients (a(p), b(p)) for p ranks (Thakur, Rabenseifner &
Gropp, IJHPCA 2005; Patarasuk & Yuan, JPDC 2009):

=========================  ========  ========  =======================================
Compute (the additions of a reduction) is not modelled: on a CPU it is folded into the fitted β.
So the sliced ring has the ring's coefficients: it sends the same bytes, and in a pipeline of S
slices per chunk the slices of a step follow one another on the link like one message (the
extra latency of the S−1 slices in flight is folded into α). What slicing saves is the time of
the adds, which this model does not see: `toolkit.cost.slicing` adds a term γ for them.
Where one line cannot follow the measurement (libraries and machines change protocol with
size), `toolkit.cost.piecewise` fits α and β per size regime.

Bandwidths as nccl-tests defines them (doc/PERFORMANCE.md): algorithm bandwidth algbw = n / t;
bus bandwidth busbw = algbw · factor, factor 2(p−1)/p for all-reduce, (p−1)/p for
reduce-scatter, all-gather and all-to-all, 1 for broadcast and reduce. busbw is what compares with
a link's peak bandwidth, whatever p is.

All-to-all (expert parallelism's dispatch and combine, Ulysses): each rank passes in n bytes, a
piece for every rank, and keeps its own piece. The pairwise exchange (Thakur et al. 2005, their
all-to-all for long messages: in step i rank r sends to r + i and receives from r − i) takes
p − 1 rounds and sends (p − 1)/p·n per rank when the pieces are equal:
t = (p − 1)·α + (p − 1)/p·n·β, with nccl-tests' bus factor (p − 1)/p. With uneven pieces (routed
tokens) the busiest rank's bytes decide; `toolkit.cost.experts` counts them piece by piece.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np


def _log2(p: int) -> int:
    return math.ceil(math.log2(p)) if p > 1 else 0


# (a(p), b(p)): messages in sequence, and multiples of n·β on the busiest path.
COEFFICIENTS: dict[str, dict[str, Callable[[int], tuple[float, float]]]] = {
    "all_reduce": {
        "ring": lambda p: (2 * (p - 1), 2 * (p - 1) / p),
        "ps": lambda p: (2 * (p - 1), 2 * (p - 1)),
        "sharded_ps": lambda p: (2 * (p - 1), 2 * (p - 1) / p),
        "tree": lambda p: (2 * _log2(p), 2 * _log2(p)),
    },
    "broadcast": {"linear": lambda p: (p - 1, p - 1), "tree": lambda p: (_log2(p), _log2(p))},
    "reduce": {"linear": lambda p: (p - 1, p - 1), "tree": lambda p: (_log2(p), _log2(p))},
    "reduce_scatter": {"ring": lambda p: (p - 1, (p - 1) / p)},
    "all_gather": {"ring": lambda p: (p - 1, (p - 1) / p)},
    "scatter": {"linear": lambda p: (p - 1, (p - 1) / p)},
    "gather": {"linear": lambda p: (p - 1, (p - 1) / p)},
    "all_to_all": {"pairwise": lambda p: (p - 1, (p - 1) / p)},
}
"""Model coefficients by collective and algorithm name (the names `toolkit.collectives` uses).
Figures and the explorer draw these; algorithms in `SAME_MODEL` share one of them."""

SAME_MODEL: dict[str, str] = {"sliced_ring": "ring"}
"""Algorithms whose α-β model is another's: the sliced ring sends the ring's bytes in the ring's
rounds (see the module docstring), so it has the ring's (a(p), b(p)) wherever there is a ring."""


def algorithms(collective: str) -> list[str]:
    """Every algorithm of `collective` that has a model, `SAME_MODEL` aliases included."""
    table = COEFFICIENTS.get(collective, {})
    return list(table) + [a for a, base in SAME_MODEL.items() if base in table]


def model_name(collective: str, algorithm: str) -> str:
    """The algorithm whose coefficients `algorithm` uses (itself, or its `SAME_MODEL` base)."""
    base = SAME_MODEL.get(algorithm)
    return base if base is not None and base in COEFFICIENTS.get(collective, {}) else algorithm


def split_label(label: str) -> tuple[str, dict[str, int]]:
    """``"sliced_ring:slice_bytes=65536:window=4"`` → (``"sliced_ring"``,
    {"slice_bytes": 65536, "window": 4}): options follow the name, each after a colon."""
    name, *items = label.split(":")
    options = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.isidentifier() or not value.lstrip("-").isdigit():
            raise ValueError(f"algorithm {label!r}: options must be key=integer pairs, "
                             "each after a colon, e.g. 'sliced_ring:slice_bytes=65536:window=4'")
        options[key] = int(value)
    return name, options


BUS_FACTOR: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda p: 2 * (p - 1) / p,
    "reduce_scatter": lambda p: (p - 1) / p,
    "all_gather": lambda p: (p - 1) / p,
    "all_to_all": lambda p: (p - 1) / p,
    "broadcast": lambda p: 1.0,
    "reduce": lambda p: 1.0,
    "scatter": lambda p: (p - 1) / p,
    "gather": lambda p: (p - 1) / p,
}
"""nccl-tests' factor from algorithm bandwidth to bus bandwidth (scatter/gather: ours, by the
same rule: the root's link carries (p−1)/p of the data)."""

TORCH = "torch"
"""The algorithm name of torch's built-in collective (gloo or NCCL), the baseline a measured
table (`toolkit.experiments.collectives.measure`) sets beside these models."""


@dataclass(frozen=True)
class AlphaBeta:
    """A link in the α-β model."""

    alpha: float
    """Latency per message, seconds (e.g. ~1e-4 for gloo over loopback, ~5e-6 for NVLink)."""
    beta: float
    """Seconds per byte: 1 / bandwidth (1e-9 is 1 GB/s)."""

    @property
    def bandwidth(self) -> float:
        """Bytes per second, 1/β."""
        return math.inf if self.beta == 0 else 1.0 / self.beta

    def __str__(self) -> str:
        return (f"α = {self.alpha * 1e6:.1f} µs, β = {self.beta * 1e9:.3f} ns/B "
                f"({self.bandwidth / 1e9:.2f} GB/s)")


def _check(collective: str, algorithm: str, p: int) -> Callable[[int], tuple[float, float]]:
    if collective not in COEFFICIENTS:
        raise ValueError(f"no cost model for collective {collective!r}; "
                         f"choose from {', '.join(COEFFICIENTS)}")
    table = COEFFICIENTS[collective]
    algorithm = model_name(collective, algorithm)
    if algorithm not in table:
        raise ValueError(f"no cost model for {collective} algorithm {algorithm!r}; "
                         f"choose from {', '.join(algorithms(collective))}")
    if not isinstance(p, (int, np.integer)) or p < 1:
        raise ValueError(f"world size p must be an int >= 1, got {p!r}")
    return table[algorithm]


def coefficients(collective: str, algorithm: str, p: int) -> tuple[float, float]:
    """(a, b) of t = a·α + b·n·β for `algorithm` of `collective` on p ranks."""
    return _check(collective, algorithm, p)(int(p))


def predict(collective: str, algorithm: str, nbytes, p: int, link: AlphaBeta):
    """Predicted seconds for n = `nbytes` (a number or a numpy array) on p ranks over `link`."""
    a, b = coefficients(collective, algorithm, p)
    return a * link.alpha + b * np.asarray(nbytes, dtype=float) * link.beta


# Bytes the busiest sender sends, as a multiple of n. Equal to b(p) for the symmetric algorithms;
# for rooted ones b(p) counts the root's link both ways (PS: (p−1)n in, then (p−1)n out).
SENT: dict[str, dict[str, Callable[[int], float]]] = {
    "all_reduce": {"ring": lambda p: 2 * (p - 1) / p, "ps": lambda p: p - 1,
                   "sharded_ps": lambda p: 2 * (p - 1) / p, "tree": lambda p: _log2(p)},
    "broadcast": {"linear": lambda p: p - 1, "tree": lambda p: _log2(p)},
    "reduce": {"linear": lambda p: 1 if p > 1 else 0, "tree": lambda p: 1 if p > 1 else 0},
    "reduce_scatter": {"ring": lambda p: (p - 1) / p},
    "all_gather": {"ring": lambda p: (p - 1) / p},
    "scatter": {"linear": lambda p: (p - 1) / p},
    "gather": {"linear": lambda p: 1 / p if p > 1 else 0},
    "all_to_all": {"pairwise": lambda p: (p - 1) / p},
}


def bytes_sent_per_rank(collective: str, algorithm: str, nbytes: float, p: int) -> float:
    """Bytes the busiest sender sends for an n-byte collective (ring all-reduce: 2(p−1)/p·n;
    parameter server: the root's (p−1)·n). Check it against `toolkit.comm`'s recorded totals."""
    _check(collective, algorithm, p)
    return SENT[collective][model_name(collective, algorithm)](int(p)) * nbytes


def algbw(nbytes, seconds):
    """Algorithm bandwidth, bytes/s: n / t (nccl-tests)."""
    return np.asarray(nbytes, dtype=float) / np.asarray(seconds, dtype=float)


def busbw(collective: str, nbytes, seconds, p: int):
    """Bus bandwidth, bytes/s: algbw × the collective's factor (see `BUS_FACTOR`)."""
    if collective not in BUS_FACTOR:
        raise ValueError(f"no bus-bandwidth factor for {collective!r}; "
                         f"choose from {', '.join(BUS_FACTOR)}")
    return algbw(nbytes, seconds) * BUS_FACTOR[collective](int(p))


def crossover_bytes(collective: str, first: str, second: str, p: int, link: AlphaBeta) -> float:
    """Message size above which `first` is faster than `second` (inf: never; 0: always).

    From a₁α + b₁nβ = a₂α + b₂nβ  ⇒  n* = (a₁ − a₂)α / ((b₂ − b₁)β).
    """
    a1, b1 = coefficients(collective, first, p)
    a2, b2 = coefficients(collective, second, p)
    if b2 - b1 <= 0:  # `first` moves at least as many bytes: it only wins on latency, if at all
        return 0.0 if a1 < a2 or (a1 == a2 and b1 < b2) else math.inf
    if link.beta == 0:
        return math.inf if a1 > a2 else 0.0
    return max(0.0, (a1 - a2) * link.alpha / ((b2 - b1) * link.beta))
