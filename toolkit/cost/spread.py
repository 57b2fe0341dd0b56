"""Medians and spreads of repeated timings, and when two runs agree.

A timing on a shared machine is a distribution, not a number. For n trials x₁ ≤ … ≤ xₙ:

* the **median** and the **interquartile range** [q₂₅, q₇₅] (linear interpolation, numpy's
  default) say where a typical trial lands and how far trials scatter;
* the **confidence interval of the median** is distribution-free: the number of trials below the
  true median is Binomial(n, ½), so [x₍ⱼ₎, x₍ₖ₎] with j, k the binomial quantiles covers it with
  probability ≥ 95 % (Conover, *Practical Nonparametric Statistics*, 3rd ed., §3.2). It narrows
  as 1/√n while the interquartile range does not: more trials pin the median, not the scatter.

For a ratio (toolkit time / built-in time) the trials are *paired*: trial i of each algorithm
ran back to back (`toolkit.experiments.collectives.measure` alternates them), so a slow second
on the machine slows both and cancels in xᵢ / yᵢ. Pure functions: numbers in, numbers out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class Spread:
    """Median, interquartile range and the 95 % confidence interval of the median of a sample."""

    median: float
    q25: float
    q75: float
    lo: float
    """Lower end of the median's 95 % confidence interval (the sample minimum for n < 6)."""
    hi: float
    n: int

    @property
    def iqr_rel(self) -> float:
        """Half the interquartile range relative to the median, ½(q₇₅ − q₂₅)/median."""
        return 0.5 * (self.q75 - self.q25) / self.median if self.median else math.inf

    @property
    def ci_rel(self) -> float:
        """Half the median's confidence interval relative to the median."""
        return 0.5 * (self.hi - self.lo) / self.median if self.median else math.inf

    def __str__(self) -> str:
        return f"{self.median:.3g} [{self.q25:.3g}-{self.q75:.3g}]"


def _binom_cdf(k: int, n: int) -> float:
    return sum(math.comb(n, i) for i in range(k + 1)) / 2.0 ** n


def median_ci_ranks(n: int, confidence: float = 0.95) -> tuple[int, int]:
    """0-based ranks (j, k) with P(x₍ⱼ₎ ≤ median ≤ x₍ₖ₎) ≥ `confidence` for n samples; (0, n−1)
    when n is too small to do better (n < 6 at 95 %)."""
    if n < 1:
        raise ValueError(f"median_ci_ranks(n={n}): need at least one sample")
    if not 0 < confidence < 1:
        raise ValueError(f"median_ci_ranks(confidence={confidence}) must be between 0 and 1")
    tail = (1 - confidence) / 2
    j = -1  # largest j with P(B ≤ j) ≤ tail, B ~ Binomial(n, ½)
    while _binom_cdf(j + 1, n) <= tail:
        j += 1
    if j < 0:
        return 0, n - 1
    return j, n - 1 - j


def spread(values: Sequence[float], *, confidence: float = 0.95) -> Spread:
    """The `Spread` of `values` (at least one finite number)."""
    x = np.sort(np.asarray(values, dtype=float))
    if x.size == 0 or not np.isfinite(x).all():
        raise ValueError(f"spread: need one or more finite values, got {list(values)[:5]}")
    j, k = median_ci_ranks(x.size, confidence)
    q25, med, q75 = np.percentile(x, [25, 50, 75])
    return Spread(float(med), float(q25), float(q75), float(x[j]), float(x[k]), int(x.size))


def paired_ratios(mine: Sequence[float], base: Sequence[float]) -> np.ndarray:
    """mineᵢ / baseᵢ, trial by trial (both lists in the order the trials ran)."""
    a, b = np.asarray(mine, dtype=float), np.asarray(base, dtype=float)
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"paired_ratios: need two equally long non-empty lists, got {a.size} "
                         f"and {b.size} trials")
    if (b <= 0).any():
        raise ValueError("paired_ratios: baseline times must be > 0")
    return a / b


def settled(values: Sequence[float], tolerance: float, *, confidence: float = 0.95) -> bool:
    """True when the median of `values` is pinned to ±`tolerance` (relative) at `confidence`."""
    return spread(values, confidence=confidence).ci_rel <= tolerance


def agree(runs: Sequence[Spread]) -> bool:
    """True when every run's median lies inside every other run's interquartile range: what
    "three runs give the same ratio within their stated spread" means here."""
    return all(a.q25 <= b.median <= a.q75 for a in runs for b in runs)
