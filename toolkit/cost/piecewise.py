"""A piecewise α-β model: one (α, β) per message-size regime, the regime boundaries from the data.

The α-β model t = a(p)·α + b(p)·n·β (`toolkit.cost.models`) is one straight line in n. Real
libraries change protocol with size, and so does the machine under them: gloo's ring all-reduce
keeps 2p segments up to 2p MiB and 1 MiB segments above (`gloo/allreduce.cc`); NCCL switches
between its LL, LL128 and Simple protocols and between ring and tree (NCCL 2.4+ tuning tables);
on a CPU, a tensor that no longer fits in cache costs more per byte. A single line cannot follow
such a step, so its error is large on one side of it whatever α and β are.

The piecewise model keeps the α-β form inside each regime: sizes sorted n₁ < … < n_m are cut
into K contiguous regimes, each fitted by `fit_alpha_beta` (least squares on relative error,
α, β ≥ 0), and the cuts are chosen by dynamic programming to minimise the total squared relative
error (the classic optimal segmentation, Bellman, "On the approximation of curves by line
segments using dynamic programming", CACM 1961). K is the smallest number of regimes, up to
`max_regimes`, whose every point is within `tolerance`; a regime needs `min_points` sizes so that
it is fitted, not interpolated. A boundary lies at the geometric mean of the sizes either side.

Pure functions: measured samples in, a model out; no process is started.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from .fit import Sample, as_samples, fit_alpha_beta
from .models import AlphaBeta, coefficients


@dataclass(frozen=True)
class Regime:
    """Sizes lo ≤ n < hi (bytes) and the link that explains them."""

    lo: float
    hi: float
    link: AlphaBeta


@dataclass(frozen=True)
class PiecewiseModel:
    """t(n) = a(p)·α_k + b(p)·n·β_k for n in regime k."""

    collective: str
    algorithm: str
    """The algorithm whose coefficients a(p), b(p) the model uses."""
    p: int
    regimes: tuple[Regime, ...]

    def regime(self, nbytes: float) -> int:
        """Index of the regime holding `nbytes`."""
        for k, r in enumerate(self.regimes):
            if nbytes < r.hi:
                return k
        return len(self.regimes) - 1

    def predict(self, nbytes):
        """Seconds for n = `nbytes` (a number or an array)."""
        a, b = coefficients(self.collective, self.algorithm, self.p)
        n = np.asarray(nbytes, dtype=float)
        alpha = np.vectorize(lambda x: self.regimes[self.regime(x)].link.alpha)(n)
        beta = np.vectorize(lambda x: self.regimes[self.regime(x)].link.beta)(n)
        return a * alpha + b * n * beta

    @property
    def boundaries(self) -> list[float]:
        """The sizes (bytes) where one regime ends and the next begins."""
        return [r.hi for r in self.regimes[:-1]]


@dataclass(frozen=True)
class PiecewiseFit:
    """A fitted `PiecewiseModel` and its error at every measured size (in increasing size)."""

    model: PiecewiseModel
    nbytes: np.ndarray
    relative_errors: np.ndarray
    """(predicted − measured) / measured at each size of `nbytes`."""

    @property
    def max_abs_error(self) -> float:
        return float(np.max(np.abs(self.relative_errors)))

    @property
    def median_abs_error(self) -> float:
        return float(np.median(np.abs(self.relative_errors)))


def _one_group(samples: list[Sample]) -> tuple[str, str, int]:
    keys = {(s.collective, s.algorithm, s.p) for s in samples}
    if len(keys) != 1:
        raise ValueError("fit_piecewise: the samples must share one collective, algorithm and p "
                         f"(fit each group separately); got {sorted(keys)}")
    return keys.pop()


def fit_piecewise(data: Iterable[Sample], *, max_regimes: int = 3, min_points: int = 3,
                  tolerance: float = 0.10) -> PiecewiseFit:
    """Fit α, β per size regime to samples of one (collective, algorithm, p).

    `data`: `Sample`s or a `measure` table restricted to one group (the ``algorithm`` column
    names the model's coefficients; see `as_model`). Samples at the same size are fitted
    together.
    """
    if max_regimes < 1 or min_points < 2:
        raise ValueError(f"fit_piecewise: need max_regimes >= 1 and min_points >= 2, got "
                         f"{max_regimes}, {min_points}")
    samples = sorted(as_samples(data), key=lambda s: s.nbytes)
    collective, algorithm, p = _one_group(samples)
    sizes = sorted({s.nbytes for s in samples})
    if len(sizes) < min_points:
        raise ValueError(f"fit_piecewise: {len(sizes)} distinct sizes; need at least "
                         f"{min_points} (min_points) to fit even one regime")
    at = [[s for s in samples if s.nbytes == n] for n in sizes]  # samples per size index

    def sse(i: int, j: int) -> tuple[float, AlphaBeta]:   # regime = sizes[i:j]
        fit = fit_alpha_beta([s for group in at[i:j] for s in group])
        return float(np.sum(fit.relative_errors ** 2)), fit.link

    m = len(sizes)
    cost = {(i, j): sse(i, j) for i in range(m) for j in range(i + min_points, m + 1)}
    best_k = None
    # best[k][j]: (total error, cuts) of sizes[:j] in k regimes
    best: list[dict[int, tuple[float, tuple[int, ...]]]] = [{0: (0.0, ())}]
    for k in range(1, max_regimes + 1):
        row = {}
        for j in range(k * min_points, m + 1):
            options = [(best[k - 1][i][0] + cost[(i, j)][0], best[k - 1][i][1] + (j,))
                       for i in best[k - 1] if (i, j) in cost]
            if options:
                row[j] = min(options)
        best.append(row)
        if m in row:
            result = _build(collective, algorithm, p, sizes, row[m][1], cost, samples)
            if best_k is None or result.max_abs_error < best_k.max_abs_error - 1e-12:
                best_k = result
            if result.max_abs_error <= tolerance:
                return result
    return best_k


def _build(collective, algorithm, p, sizes, cuts, cost, samples) -> PiecewiseFit:
    regimes, start = [], 0
    for n, end in enumerate(cuts):
        lo = 0.0 if n == 0 else math.sqrt(sizes[start - 1] * sizes[start])
        hi = math.inf if end == len(sizes) else math.sqrt(sizes[end - 1] * sizes[end])
        regimes.append(Regime(lo, hi, cost[(start, end)][1]))
        start = end
    model = PiecewiseModel(collective, algorithm, int(p), tuple(regimes))
    n = np.array([s.nbytes for s in samples])
    t = np.array([s.seconds for s in samples])
    return PiecewiseFit(model, n, (model.predict(n) - t) / t)


def as_model(table, algorithm: str, model_algorithm: str | None = None) -> list[Sample]:
    """Samples of `algorithm` from a `measure` table, relabelled to `model_algorithm`'s
    coefficients (e.g. torch's gloo all-reduce as a "ring", its broadcast as a "tree")."""
    rows = table[table.algorithm == algorithm]
    if rows.empty:
        raise ValueError(f"as_model: no rows for algorithm {algorithm!r}")
    name = model_algorithm or algorithm.partition(":")[0]
    return [Sample(r.collective, name, int(r.p), float(r.nbytes), float(r.seconds))
            for r in rows.itertuples()]


def errors_at(fit: PiecewiseFit, data: Sequence[Sample]) -> np.ndarray:
    """(predicted − measured) / measured of `fit`'s model on other samples (another run)."""
    samples = as_samples(data)
    n = np.array([s.nbytes for s in samples])
    t = np.array([s.seconds for s in samples])
    return (fit.model.predict(n) - t) / t
