"""The gradient noise scale and the critical batch size: how far "fewer, larger steps" goes.

McCandlish, Kaplan, Amodei & OpenAI Dota Team, "An Empirical Model of Large-Batch Training",
2018, arXiv:1812.06162. With G the true gradient and Σ the per-example covariance of the
gradient, a batch of B examples estimates G with covariance Σ/B. For a quadratic model of the
loss and the best step size (§2.2) the improvement per step is

    ΔL(B) = ΔL_max / (1 + B_noise/B),        B_noise = tr(H·Σ) / (Gᵀ·H·G),

and with the Hessian H taken as the identity, the *simple noise scale*
B_simple = tr(Σ)/|G|², which the paper measures. Below B_noise, doubling the batch nearly halves
the steps (noise dominates each step); above it, more examples per step buy almost nothing. Over
a whole run (§2.3) the steps S and examples E = B·S needed to reach a loss trade off as

    (S/S_min − 1)·(E/E_min − 1) = 1,        B_crit = E_min/S_min ≈ B_noise,

so at B = B_crit a run takes 2·S_min steps and 2·E_min examples: `steps_and_examples`.

Measuring B_simple needs |G|² and tr(Σ), which one batch cannot give (|G_B|² is biased upward by
tr(Σ)/B). Appendix A.1's estimator uses gradient norms at two batch sizes, B_small < B_big,
which data parallelism gives for free: each rank's local gradient (B_small = b) and the averaged
one (B_big = p·b). With E|G_B|² = |G|² + tr(Σ)/B, solving the two equations gives

    |G|²  ≈ (B_big·|G_big|² − B_small·|G_small|²) / (B_big − B_small)
    tr(Σ) ≈ (|G_small|² − |G_big|²) / (1/B_small − 1/B_big)

each unbiased; their ratio is not, so average each over many steps first, then divide
(`noise_scale`). Pure numbers in, numbers out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..arguments import check_positive

__all__ = ["NoiseScale", "noise_scale", "steps_and_examples"]


@dataclass(frozen=True)
class NoiseScale:
    """The two unbiased estimates of Appendix A.1 and their ratio."""

    grad_sq: float
    """|G|², the squared norm of the true gradient."""
    trace: float
    """tr(Σ), the per-example gradient variance summed over parameters."""

    @property
    def b_simple(self) -> float:
        """tr(Σ)/|G|², the simple noise scale (inf when |G|² ≤ 0: noise only)."""
        return self.trace / self.grad_sq if self.grad_sq > 0 else math.inf


def noise_scale(g_small_sq: float, g_big_sq: float, *, b_small: float,
                b_big: float) -> NoiseScale:
    """|G|² and tr(Σ) from mean squared gradient norms at two batch sizes (Appendix A.1).

    ``g_small_sq``: mean |G_small|² over steps (and ranks) at batch ``b_small``;
    ``g_big_sq``: mean |G_big|² at ``b_big`` (> b_small)."""
    check_positive("noise_scale", "b_small", b_small)
    check_positive("noise_scale", "b_big", b_big)
    if b_big <= b_small:
        raise ValueError(f"noise_scale: b_big must exceed b_small, got {b_big} and {b_small}")
    grad_sq = (b_big * g_big_sq - b_small * g_small_sq) / (b_big - b_small)
    trace = (g_small_sq - g_big_sq) / (1 / b_small - 1 / b_big)
    return NoiseScale(grad_sq=grad_sq, trace=trace)


def steps_and_examples(batch: float, b_crit: float) -> tuple[float, float]:
    """(S/S_min, E/E_min) at batch B: 1 + B_crit/B steps and 1 + B/B_crit examples, the
    hyperbola (S/S_min − 1)(E/E_min − 1) = 1 of McCandlish et al. §2.3."""
    check_positive("steps_and_examples", "batch", batch)
    check_positive("steps_and_examples", "b_crit", b_crit)
    return 1 + b_crit / batch, 1 + batch / b_crit
