"""toolkit.cost: the α-β formulas, bandwidth definitions, the fit, and a tiny real sweep."""

from __future__ import annotations

import math

import numpy as np
import pytest

from toolkit import comm, cost
from toolkit import collectives as C
from toolkit.experiments.collectives import measure
from toolkit.launch import spawn

LINK = cost.AlphaBeta(alpha=50e-6, beta=1e-9)  # 50 µs, 1 GB/s


def test_ring_all_reduce_formula_and_published_values():
    p, n = 4, 64 << 20
    assert cost.coefficients("all_reduce", "ring", p) == (6, 1.5)
    t = cost.predict("all_reduce", "ring", n, p, LINK)
    assert t == pytest.approx(2 * (p - 1) * 50e-6 + 2 * (p - 1) / p * n * 1e-9)
    # Ring traffic per rank is below 2n for any p; the parameter server's root grows with p.
    for p in (2, 8, 64, 1024):
        assert cost.bytes_sent_per_rank("all_reduce", "ring", 1.0, p) < 2
        assert cost.bytes_sent_per_rank("all_reduce", "ps", 1.0, p) == p - 1
        assert cost.coefficients("all_reduce", "ps", p)[1] == 2 * (p - 1)  # in + out at the root
    assert cost.coefficients("all_reduce", "tree", 8) == (6, 6)
    assert cost.coefficients("broadcast", "tree", 5) == (3, 3)
    assert cost.coefficients("reduce_scatter", "ring", 4) == (3, 0.75)
    assert cost.predict("all_reduce", "ring", [0, 1e6], 1, LINK).tolist() == [0.0, 0.0]


def test_busbw_factors_are_nccl_tests():
    # nccl-tests doc/PERFORMANCE.md: all-reduce 2(p-1)/p, reduce-scatter/all-gather (p-1)/p,
    # broadcast and reduce 1.
    n, t, p = 1e9, 1.0, 8
    assert cost.algbw(n, t) == 1e9
    assert cost.busbw("all_reduce", n, t, p) == pytest.approx(1e9 * 14 / 8)
    assert cost.busbw("all_gather", n, t, p) == pytest.approx(1e9 * 7 / 8)
    assert cost.busbw("reduce_scatter", n, t, p) == pytest.approx(1e9 * 7 / 8)
    assert cost.busbw("broadcast", n, t, p) == cost.busbw("reduce", n, t, p) == 1e9
    # A ring all-reduce that runs at the model's speed shows a bus bandwidth of 1/β at large n.
    big = 1e10
    t_ring = cost.predict("all_reduce", "ring", big, p, LINK)
    assert cost.busbw("all_reduce", big, t_ring, p) == pytest.approx(LINK.bandwidth, rel=1e-3)


def test_crossover_of_ring_and_parameter_server():
    # Ring (a=2(p-1), b=2(p-1)/p) vs PS (a=2(p-1), b=2(p-1)): same latency, ring moves less,
    # so the ring wins at every size; vs the tree (fewer rounds) it wins above n*.
    assert cost.crossover_bytes("all_reduce", "ring", "ps", 4, LINK) == 0.0
    n_star = cost.crossover_bytes("all_reduce", "ring", "tree", 8, LINK)
    a1, b1 = cost.coefficients("all_reduce", "ring", 8)
    a2, b2 = cost.coefficients("all_reduce", "tree", 8)
    assert n_star == pytest.approx((a1 - a2) * LINK.alpha / ((b2 - b1) * LINK.beta))
    below, above = n_star / 2, n_star * 2
    ring, tree = (lambda n, a=a: cost.predict("all_reduce", a, n, 8, LINK)
                  for a in ("ring", "tree"))
    assert ring(below) > tree(below) and ring(above) < tree(above)
    assert cost.crossover_bytes("all_reduce", "ps", "ring", 4, LINK) == math.inf


def test_fit_recovers_alpha_and_beta_from_exact_samples():
    samples = [cost.Sample("all_reduce", alg, p, n,
                           float(cost.predict("all_reduce", alg, n, p, LINK)))
               for alg in ("ring", "ps", "tree") for p in (2, 4) for n in (4e3, 1e5, 4e6, 6.4e7)]
    fit = cost.fit_alpha_beta(samples)
    assert fit.link.alpha == pytest.approx(LINK.alpha, rel=1e-6)
    assert fit.link.beta == pytest.approx(LINK.beta, rel=1e-6)
    assert fit.max_abs_error < 1e-9


def test_fit_minimises_relative_error_and_keeps_parameters_non_negative():
    rng = np.random.default_rng(0)
    sizes = np.geomspace(4e3, 6.4e7, 12)
    noisy = [cost.Sample("all_reduce", "ring", 4, n,
                         float(cost.predict("all_reduce", "ring", n, 4, LINK))
                         * rng.uniform(0.9, 1.1))
             for n in sizes]
    fit = cost.fit_alpha_beta(noisy)
    assert fit.max_abs_error < 0.2 and fit.link.alpha > 0 and fit.link.beta > 0
    # Times that shrink with size would need a negative α or β: the fit clamps at 0.
    odd = [cost.Sample("all_reduce", "ring", 2, n, t)
           for n, t in [(1e3, 1.0), (1e6, 0.5), (1e7, 0.4)]]
    fit = cost.fit_alpha_beta(odd)
    assert fit.link.alpha >= 0 and fit.link.beta >= 0
    assert np.allclose(cost.relative_errors(odd, fit.link), fit.relative_errors)


@pytest.mark.parametrize("call, words", [
    (lambda: cost.coefficients("all_reduce", "butterfly", 4), "choose from ring, ps"),
    (lambda: cost.coefficients("all_to_al", "ring", 4), "no cost model for collective"),
    (lambda: cost.coefficients("all_reduce", "ring", 0), "world size p"),
    (lambda: cost.fit_alpha_beta([cost.Sample("all_reduce", "ring", 2, 1e3, 1e-3)]), "two or more"),
    (lambda: cost.fit_alpha_beta([cost.Sample("all_reduce", "ring", 2, 1e3, 0.0)] * 2), "> 0 s"),
    (lambda: cost.busbw("median", 1, 1, 2), "bus-bandwidth factor"),
    (lambda: measure([("all_reduce", "butterfly")], sizes=[8], world_sizes=[2]), "butterfly"),
    (lambda: measure([("all_reduce", "ring")], sizes=[8], world_sizes=[1]), ">= 2"),
    (lambda: measure([("all_reduce", "ring")], sizes=[0], world_sizes=[2]), "positive"),
    (lambda: measure([("all_reduce", "ring")], sizes=[8], world_sizes=[2], repeats=5,
                     max_repeats=3), "max_repeats >= repeats"),
    (lambda: measure([("all_reduce", "sliced_ring:window")], sizes=[8], world_sizes=[2]),
     "key=integer"),
    (lambda: measure([("all_reduce", "torch:slice_bytes=4")], sizes=[8], world_sizes=[2]),
     "no options"),
    (lambda: measure([("all_reduce", "ring")] * 2, sizes=[8], world_sizes=[2]), "twice"),
])
def test_bad_input_says_what_was_expected(call, words):
    with pytest.raises(ValueError, match=words):
        call()


def test_models_match_the_traffic_the_collectives_record():
    """b(p)·n from the model = bytes the busiest rank sends in a real run (ring, PS, tree...)."""
    numel, p = 1200, 4
    X = 4 * numel

    def work(rank, world_size, collective, algorithm):
        t = torch_ones(numel)
        fn = C.get_algorithm(collective, algorithm)
        fn(t, check=False) if collective == "all_reduce" else fn(t, 0, check=False)

    for collective, algorithm in [("all_reduce", "ring"), ("all_reduce", "sharded_ps"),
                                  ("all_reduce", "ps"), ("all_reduce", "tree"),
                                  ("broadcast", "linear"), ("broadcast", "tree"),
                                  ("reduce", "linear"), ("reduce", "tree")]:
        with comm.recording() as trace:
            spawn(work, p, collective, algorithm, timeout=30)
        busiest = max(t.bytes_sent for t in trace.totals().values())
        assert busiest == cost.bytes_sent_per_rank(collective, algorithm, X, p), (
            collective + algorithm)


def torch_ones(n):
    import torch
    return torch.ones(n)


@pytest.mark.multirank
def test_measure_returns_a_table_with_bandwidths():
    df = measure([("all_reduce", "ring"), ("all_reduce", "torch"), ("all_gather", "ring"),
                       ("broadcast", "tree"), ("scatter", "linear"), ("reduce_scatter", "torch")],
                      sizes=[4096, 65536], world_sizes=[2, 3], repeats=2, min_time=0.001)
    assert len(df) == 6 * 2 * 2
    assert set(df.columns) >= {"collective", "algorithm", "p", "nbytes", "seconds", "algbw",
                               "busbw", "q25_seconds", "q75_seconds", "ratio", "trials"}
    assert (df.seconds > 0).all() and (df.min_seconds <= df.seconds).all()
    ar = df[(df.collective == "all_reduce") & (df.p == 3)]
    assert np.allclose(ar.busbw, ar.algbw * 4 / 3)
    assert (df[df.collective == "all_gather"].nbytes % (4 * 3) == 0).sum() >= 2  # p | n for p = 3
    assert set(df.backend) == {"gloo"}
    fit = cost.fit_alpha_beta(df[df.algorithm != "torch"])
    assert fit.link.alpha >= 0 and fit.link.beta >= 0
    # A ratio only where the collective's built-in ran beside it.
    assert df[df.collective == "all_reduce"].query("algorithm == 'ring'").ratio.notna().all()
    assert df[df.collective != "all_reduce"].ratio.isna().all()


@pytest.mark.multirank
def test_measure_alternates_the_algorithms_and_pairs_their_trials():
    cases = [("all_reduce", "sliced_ring:slice_bytes=4096"), ("all_reduce", "torch"),
             ("all_reduce", "ring")]
    with comm.recording() as trace:
        df = measure(cases, sizes=[65536], world_sizes=[2], repeats=4, max_repeats=4,
                     warmup=1, min_time=0.0)
    assert list(df.algorithm) == [c[1] for c in cases] and (df.trials == 4).all()
    assert (df.calls == 1).all()  # min_time 0: one call per trial
    trials = df.attrs["trials"]
    base = trials[("all_reduce", "torch", 2, 65536)]
    for r in df[df.algorithm != "torch"].itertuples():
        mine = trials[("all_reduce", r.algorithm, 2, 65536)]
        s = cost.spread(cost.paired_ratios(mine, base))
        assert (r.ratio, r.ratio_q25, r.ratio_q75) == (s.median, s.q25, s.q75)
        assert r.seconds == cost.spread(mine).median and r.baseline == "torch"
    # Program order on rank 0: each trial starts with a barrier; the algorithms' trials follow
    # each other in an order rotated every round (A B C, B C A, C A B, A B C).
    events = sorted(trace.where(rank=0).events, key=lambda e: e.seq)
    kinds, current = [], None
    for e in events:
        if e.op == "barrier":
            current = []
            kinds.append(current)
        elif current is not None and e.dtype != "float64":   # not the max of the times
            current.append("torch" if e.op == "all_reduce" else "ours")
    labels = []   # per trial: which algorithm (sliced: S = 8 slices, 2·1·8 sends; simple: 2)
    for k in kinds:
        labels.append("torch" if k == ["torch"] else "sliced" if len(k) == 32 else "ring")
    rounds = [labels[i:i + 3] for i in range(0, len(labels), 3)]
    assert rounds[0] == ["sliced", "torch", "ring"]            # the warm-up round
    assert rounds[1:] == [["sliced", "torch", "ring"], ["torch", "ring", "sliced"],
                          ["ring", "sliced", "torch"], ["sliced", "torch", "ring"]]
