"""toolkit.cost.experts: the capacity rule, dropped tokens and padding, and the bytes of expert
parallelism's all-to-alls, on values worked out by hand; the pairwise all-to-all's α-β model.
(The bytes are also checked against the recorder on real ranks: tests/test_expert_parallel.py.)
"""

from __future__ import annotations

import pytest

from toolkit import cost
from toolkit.cost.experts import (
    balanced_step_bytes, dropped, expert_capacity, imbalance, kept, padding_rows,
    rows_per_expert, skewed_loads, step_bytes,
)


def test_capacity_rule() -> None:
    assert expert_capacity(8, 4) == 2                                # Switch: T/E · cf
    assert expert_capacity(8, 4, capacity_factor=1.25) == 3          # ⌈2.5⌉
    assert expert_capacity(8, 4, top_k=2) == 4                       # GShard: 2T/E
    assert expert_capacity(10, 11, capacity_factor=1.1) == 1         # 1.1·10/11 is 1, not 1.0…2
    assert expert_capacity(0, 4) == 0
    assert expert_capacity(7, 4, capacity_factor=None) == 7          # no limit: C = T
    for bad, match in (
        (dict(tokens=-1, num_experts=4), "tokens must be an int >= 0"),
        (dict(tokens=4, num_experts=4, top_k=5), "top_k .* must be an int in 1 … 4"),
        (dict(tokens=4, num_experts=4, capacity_factor=0), "capacity_factor must be a number"),
    ):
        with pytest.raises(ValueError, match=match):
            expert_capacity(**bad)


def test_dropped_padding_imbalance() -> None:
    loads = [6, 2, 3, 1]  # 12 choices, mean 3
    assert kept(loads, 3) == [3, 2, 3, 1]
    assert dropped(loads, 3) == 3 and padding_rows(loads, 3) == 4 * 3 - 9
    assert imbalance(loads) == 2.0 and imbalance([0, 0]) == 1.0
    hot = skewed_loads(64, 8, top_k=2, imbalance=3.0)
    assert sum(hot) == pytest.approx(128) and hot[0] == pytest.approx(48)
    assert imbalance(hot) == pytest.approx(3.0)
    assert skewed_loads(64, 8, imbalance=1.0) == [8.0] * 8
    with pytest.raises(ValueError, match="imbalance must be a number in 1 … num_experts=8"):
        skewed_loads(64, 8, imbalance=9)


def test_step_bytes_by_hand() -> None:
    # 2 ranks, 4 experts (rank 0: experts 0-1, rank 1: experts 2-3), d = 3, 4-byte elements.
    rows = [[2, 1, 0, 3],   # rank 0 keeps 3 rows, sends 3 to rank 1
            [1, 1, 2, 0]]   # rank 1 sends 2 to rank 0, keeps 2
    r0, r1 = step_bytes(rows, hidden=3, elem_bytes=4)
    assert (r0["send_rows"], r0["recv_rows"], r1["send_rows"], r1["recv_rows"]) == (6, 5, 4, 5)
    row = 3 * 4
    assert r0["forward_in"] == 4 * 8 + (6 + 5) * row    # counts, dispatch S, combine R
    assert r0["backward_in"] == (5 + 6) * row
    assert r0["forward_wire"] == 2 * 8 + (3 + 2) * row  # E/ep counts to the other rank
    assert r1["step_wire"] == 2 * 8 + 2 * (2 + 3) * row
    assert rows_per_expert([[5, 0, 2, 1]], [2]) == [[2, 0, 2, 1]]
    assert rows_per_expert([[5, 0, 2, 1]], [2], pad=True) == [[2, 2, 2, 2]]
    with pytest.raises(ValueError, match="ep=3 must divide the experts"):
        step_bytes([[1, 1], [1, 1], [1, 1]], hidden=2, elem_bytes=4)


def test_balanced_formula_equals_the_counts() -> None:
    # Balanced: each of ep = 4 ranks sends k·T/E rows to every expert; wire = 4·kT·d·b·(ep−1)/ep.
    ep, experts, k, T, d, b = 4, 8, 2, 64, 16, 2
    rows = [[k * T // experts] * experts for _ in range(ep)]
    per_rank = step_bytes(rows, hidden=d, elem_bytes=b)
    counts = (ep - 1) * (experts // ep) * 8  # forward only: E/ep int64 to each peer
    for r in per_rank:
        assert r["step_wire"] - counts == balanced_step_bytes(T, hidden=d, top_k=k, ep=ep,
                                                              elem_bytes=b)
    assert balanced_step_bytes(T, hidden=d, top_k=k, ep=1, elem_bytes=b) == 0


def test_pairwise_all_to_all_model() -> None:
    assert cost.coefficients("all_to_all", "pairwise", 4) == (3, 0.75)
    link = cost.AlphaBeta(alpha=1e-5, beta=1e-9)
    assert cost.predict("all_to_all", "pairwise", 4e6, 4, link) == pytest.approx(3e-5 + 3e-3)
    assert cost.bytes_sent_per_rank("all_to_all", "pairwise", 4e6, 4) == 3e6
