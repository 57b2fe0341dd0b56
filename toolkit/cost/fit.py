"""Fitting α and β of the α-β model to measured collective times.

Every model is linear in (α, β): t = a·α + (b·n)·β. Least squares on *relative* error,

    minimise Σᵢ ((aᵢα + bᵢnᵢβ − tᵢ) / tᵢ)²,

weighs a 4 KB message (tens of µs) as much as a 64 MB one (a tenth of a second); plain least
squares would fit the large sizes and leave the small ones, where α matters, 100 % wrong.
Both parameters are kept ≥ 0 (a negative latency is no model of a link).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

from .models import AlphaBeta, coefficients


@dataclass(frozen=True)
class Sample:
    """One measured time."""

    collective: str
    algorithm: str
    p: int
    nbytes: float
    seconds: float


@dataclass(frozen=True)
class Fit:
    """α and β fitted to some samples, and how well they explain them."""

    link: AlphaBeta
    relative_errors: np.ndarray
    """(predicted − measured) / measured, per sample, in the order given."""

    @property
    def max_abs_error(self) -> float:
        return float(np.max(np.abs(self.relative_errors))) if self.relative_errors.size else 0.0

    @property
    def median_abs_error(self) -> float:
        return float(np.median(np.abs(self.relative_errors))) if self.relative_errors.size else 0.0


def as_samples(data) -> list[Sample]:
    """Samples from a list of `Sample` or a DataFrame with the same columns (extra ones ignored)."""
    if hasattr(data, "itertuples"):
        missing = {"collective", "algorithm", "p", "nbytes", "seconds"} - set(data.columns)
        if missing:
            raise ValueError(f"fit_alpha_beta: the table lacks columns {sorted(missing)}")
        return [Sample(r.collective, r.algorithm, int(r.p), float(r.nbytes), float(r.seconds))
                for r in data.itertuples()]
    return [s if isinstance(s, Sample) else Sample(*s) for s in data]


def _design(samples: list[Sample]) -> tuple[np.ndarray, np.ndarray]:
    rows, t = [], []
    for s in samples:
        if not s.seconds > 0:
            raise ValueError(f"fit_alpha_beta: measured time must be > 0 s, got {s.seconds} "
                             f"for {s}")
        a, b = coefficients(s.collective, s.algorithm, s.p)
        rows.append((a, b * s.nbytes))
        t.append(s.seconds)
    return np.array(rows, dtype=float), np.array(t, dtype=float)


def fit_alpha_beta(data: Iterable[Sample]) -> Fit:
    """Least-squares α, β (relative error, both ≥ 0) over measured samples.

    `data`: `Sample`s, (collective, algorithm, p, nbytes, seconds) tuples, or the DataFrame that
    `toolkit.experiments.collectives.measure` returns. Needs at least two samples that tell α
    from β (two sizes).
    """
    samples = as_samples(data)
    X, t = _design(samples)
    if len(samples) < 2 or np.linalg.matrix_rank(X) < 2:
        raise ValueError("fit_alpha_beta needs samples at two or more message sizes (with p > 1) "
                         "to tell latency from bandwidth")
    A, y = X / t[:, None], np.ones_like(t)
    candidates = []
    coef, *_ = np.linalg.lstsq(A, y, rcond=None)
    if (coef >= 0).all():
        candidates.append(coef)
    else:  # the optimum lies on a boundary: one parameter is 0, fit the other alone
        for j in (0, 1):
            col = A[:, j]
            c = np.zeros(2)
            c[j] = max(0.0, float(col @ y / (col @ col))) if col @ col > 0 else 0.0
            candidates.append(c)
    best = min(candidates, key=lambda c: float(np.sum((A @ c - y) ** 2)))
    link = AlphaBeta(alpha=float(best[0]), beta=float(best[1]))
    return Fit(link=link, relative_errors=(X @ best - t) / t)


def relative_errors(data: Iterable[Sample], link: AlphaBeta) -> np.ndarray:
    """(predicted − measured) / measured for each sample under `link`."""
    X, t = _design(as_samples(data))
    return (X @ np.array([link.alpha, link.beta]) - t) / t
