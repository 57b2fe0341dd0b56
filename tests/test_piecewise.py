"""toolkit.cost.piecewise (α and β per size regime), toolkit.cost.slicing (the adds the α-β
model leaves out) and toolkit.cost.spread (medians, spreads, agreement): pure math, known values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from toolkit import cost
from toolkit.cost.piecewise import errors_at
from toolkit.cost.spread import median_ci_ranks, settled

SMALL = cost.AlphaBeta(alpha=100e-6, beta=1e-9)   # 100 µs, 1 GB/s
LARGE = cost.AlphaBeta(alpha=900e-6, beta=2e-9)   # a protocol switch: slower per byte too
SIZES = [4096 * 2 ** k for k in range(15)]        # 4 KB … 64 MB, as the benchmark sweeps


def _samples(link_of, p=4, algorithm="ring", noise=None):
    rng = np.random.default_rng(0)
    out = []
    for n in SIZES:
        t = float(cost.predict("all_reduce", algorithm, n, p, link_of(n)))
        t *= rng.uniform(*noise) if noise else 1
        out.append(cost.Sample("all_reduce", algorithm, p, n, t))
    return out


def test_a_step_in_the_data_is_found_and_both_links_recovered():
    step = 1 << 20
    fit = cost.fit_piecewise(_samples(lambda n: SMALL if n < step else LARGE))
    (first, second) = fit.model.regimes
    assert first.lo == 0 and second.hi == math.inf
    assert 512 << 10 < fit.model.boundaries[0] < step   # between the sizes either side of the step
    assert first.link.alpha == pytest.approx(SMALL.alpha)
    assert first.link.beta == pytest.approx(SMALL.beta)
    assert second.link.alpha == pytest.approx(LARGE.alpha, rel=1e-6)
    assert second.link.beta == pytest.approx(LARGE.beta, rel=1e-6)
    assert fit.max_abs_error < 1e-9
    # One line cannot follow the step: its worst error is large whatever α and β are.
    assert cost.fit_alpha_beta(_samples(lambda n: SMALL if n < step else LARGE)).max_abs_error > 0.3
    assert fit.model.regime(4096) == 0 and fit.model.regime(64 << 20) == 1
    assert fit.model.predict(step) == pytest.approx(
        cost.predict("all_reduce", "ring", step, 4, LARGE))


def test_one_regime_when_one_line_is_enough_and_min_points_respected():
    fit = cost.fit_piecewise(_samples(lambda n: SMALL, noise=(0.97, 1.03)))
    assert len(fit.model.regimes) == 1 and fit.max_abs_error < 0.10
    # Noise no regime can explain within the tolerance: the split with the smallest worst error
    # (never worse than one line, which is a candidate), each regime of at least min_points sizes.
    noisy = _samples(lambda n: SMALL, noise=(0.6, 1.4))
    rough = cost.fit_piecewise(noisy, tolerance=0.01, max_regimes=3, min_points=4)
    assert rough.max_abs_error > 0.01 and 1 <= len(rough.model.regimes) <= 3
    counts = [sum(r.lo <= n < r.hi for n in SIZES) for r in rough.model.regimes]
    assert sum(counts) == len(SIZES) and min(counts) >= 4
    assert rough.max_abs_error <= cost.fit_alpha_beta(noisy).max_abs_error


def test_errors_on_another_run_and_relabelled_tables():
    import pandas as pd

    fit = cost.fit_piecewise(_samples(lambda n: SMALL))
    other = _samples(lambda n: cost.AlphaBeta(SMALL.alpha * 1.1, SMALL.beta * 1.1))
    assert np.allclose(errors_at(fit, other), 1 / 1.1 - 1)
    table = pd.DataFrame([dict(collective=s.collective, algorithm="torch", p=s.p, nbytes=s.nbytes,
                               seconds=s.seconds) for s in other])
    as_ring = cost.as_model(table, "torch", "ring")
    assert {s.algorithm for s in as_ring} == {"ring"} and len(as_ring) == len(SIZES)


@pytest.mark.parametrize("call, words", [
    (lambda: cost.fit_piecewise(_samples(lambda n: SMALL)[:2]), "distinct sizes"),
    (lambda: cost.fit_piecewise(_samples(lambda n: SMALL) + _samples(lambda n: SMALL, p=2)),
     "one collective, algorithm and p"),
    (lambda: cost.fit_piecewise(_samples(lambda n: SMALL), min_points=1), "min_points"),
])
def test_piecewise_bad_input(call, words):
    with pytest.raises(ValueError, match=words):
        call()


def test_sliced_ring_model_hides_the_adds_at_a_price_in_latency():
    n, p, gamma = 64 << 20, 4, 0.5e-9
    one = cost.sliced_ring_time(n, p, SMALL, gamma=gamma, slices=1)
    # S = 1 is the simple ring with its adds: 2(p−1)α + 2(p−1)/p·nβ + (p−1)/p·nγ.
    assert one == pytest.approx(6 * SMALL.alpha + 1.5 * n * SMALL.beta + 0.75 * n * gamma)
    best = cost.best_slices(n, p, SMALL, gamma=gamma)
    assert best == round(math.sqrt(n * gamma / (2 * p * SMALL.alpha)))   # S* = √(nγ/(2pα))
    times = cost.sliced_ring_time(n, p, SMALL, gamma=gamma, slices=np.arange(1, 200))
    assert int(np.argmin(times)) + 1 == best
    assert cost.slicing_speedup(n, p, SMALL, gamma=gamma, slices=best) > 1
    # Without adds (all-gather) slicing only costs latency; with γ = 0 too.
    assert cost.best_slices(n, p, SMALL, gamma=gamma, collective="all_gather") == 1
    assert cost.slicing_speedup(n, p, SMALL, gamma=0.0, slices=8) < 1
    rs = cost.sliced_ring_time(n, p, SMALL, gamma=gamma, slices=4, collective="reduce_scatter")
    assert rs == pytest.approx(3 * 4 * SMALL.alpha + 0.75 * n * SMALL.beta + 0.75 * n * gamma / 4)
    with pytest.raises(ValueError, match="slices"):
        cost.sliced_ring_time(n, p, SMALL, gamma=gamma, slices=0)
    with pytest.raises(ValueError, match="collective"):
        cost.sliced_ring_time(n, p, SMALL, gamma=gamma, collective="broadcast")


def test_median_confidence_ranks_are_the_binomial_ones():
    # Conover's table: n = 6 → (x₁, x₆); n = 9 → (x₂, x₈); n = 20 → (x₆, x₁₅), 1-based.
    assert median_ci_ranks(6) == (0, 5)
    assert median_ci_ranks(9) == (1, 7)
    assert median_ci_ranks(20) == (5, 14)
    assert median_ci_ranks(5) == (0, 4)   # too few for 95 %: the whole range
    with pytest.raises(ValueError, match="at least one"):
        median_ci_ranks(0)


def test_spread_ratios_and_agreement():
    s = cost.spread([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s.median, s.q25, s.q75, s.lo, s.hi, s.n) == (3.0, 2.0, 4.0, 1.0, 5.0, 5)
    assert s.iqr_rel == pytest.approx(1 / 3)
    r = cost.paired_ratios([2.0, 3.0], [1.0, 2.0])
    assert r.tolist() == [2.0, 1.5]
    with pytest.raises(ValueError, match="equally long"):
        cost.paired_ratios([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="finite"):
        cost.spread([])
    a, b = cost.spread([1.0, 1.1, 1.2, 1.3]), cost.spread([1.1, 1.15, 1.2, 1.25])
    assert cost.agree([a, b])
    assert not cost.agree([a, cost.spread([2.0, 2.1, 2.2])])
    assert settled([1.0] * 9, 0.01) and not settled([1.0, 2.0, 3.0], 0.01)
