"""toolkit.expert_parallel on one process: the router (top-k, gates, slots, capacity), the
load-balancing loss, the router's statistics, and MoELayer against a token-by-token reference,
outputs and every gradient, with groups (one of them empty), drops, top-1 and top-2, ragged and
padded buffers; FLOPs counted by torch against the formula.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from toolkit.expert_parallel import (
    Experts, MoELayer, dispatch, load_balancing_loss, route, router_stats,
)

D, FF, E = 6, 10, 4


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal to float64 rounding: an absolute 1e-12 (allclose's default rtol of 1e-5 would hide
    a gradient scaled by 1 + 1e-7)."""
    return a.shape == b.shape and (a - b).abs().max().item() <= 1e-12


def reference(moe: MoELayer, x: torch.Tensor, sizes: list[int]) -> tuple[torch.Tensor, ...]:
    """Token by token: y_t = Σ kept g·E_e(x_t); aux = mean over groups of E·Σ f·P, written out
    from the papers' definitions (no dispatch, no sorting)."""
    ys, auxes = [], []
    ex = moe.experts
    for xg in x.split(sizes):
        T = xg.shape[0]
        probs = torch.softmax(xg @ moe.router.weight.t(), dim=-1)
        cf = moe.capacity_factor
        cap = T if cf is None else math.ceil(round(cf * moe.top_k * T / E, 9))
        used = [0] * E
        top, idx = probs.topk(moe.top_k, dim=-1)
        gates = top if moe.top_k == 1 else top / top.sum(-1, keepdim=True)
        rows = [torch.zeros(D, dtype=x.dtype) for _ in range(T)]
        for j in range(moe.top_k):          # every first choice before any second one
            for t in range(T):
                e = int(idx[t, j])
                if used[e] < cap:
                    used[e] += 1
                    h = F.gelu(xg[t] @ ex.w1[e] + ex.b1[e]) @ ex.w2[e] + ex.b2[e]
                    rows[t] = rows[t] + gates[t, j] * h
        ys.append(torch.stack(rows) if rows else xg * 0)
        if T:
            f = torch.bincount(idx[:, 0], minlength=E).to(x.dtype) / T
            auxes.append(E * (f * probs.mean(0)).sum())
        else:
            auxes.append(probs.sum())
    return torch.cat(ys), torch.stack(auxes).mean()


def test_route_slots_capacity_and_gates_by_hand() -> None:
    # Choices (best first): t0 (0, 1), t1 (1, 0), t2 (0, 2), t3 (0, 1); E = 3, k = 2, T = 4.
    logits = torch.tensor([[3.0, 2.0, 0.0], [2.0, 3.0, 0.0], [3.0, 0.0, 2.0], [3.0, 2.0, 0.0]])
    r = route(logits, top_k=2, capacity_factor=0.75)  # C = ceil(0.75·2·4/3) = 2
    assert r.capacity == 2
    assert r.expert.tolist() == [[0, 1], [1, 0], [0, 2], [0, 1]]
    # Expert 0 takes t0, t2, t3 as first choices (slots 0-2), then t1's second (3); expert 1
    # takes t1 first (0), then the second choices of t0 (1) and t3 (2); expert 2 t2's (0).
    assert r.slot.tolist() == [[0, 1], [0, 3], [1, 0], [2, 2]]
    assert r.kept.tolist() == [[True, True], [True, False], [True, True], [False, False]]
    assert torch.allclose(r.gate.sum(1), torch.ones(4))  # k > 1: renormalised over the k
    assert r.load().tolist() == [4, 3, 1] and r.kept_load().tolist() == [2, 2, 1]
    stats = router_stats(r)
    assert (stats.dropped, stats.dropped_tokens, stats.padding) == (3, 1, 3 * 2 - 5)
    assert stats.imbalance == pytest.approx(4 / (8 / 3))
    top1 = route(logits, top_k=1, capacity_factor=None)
    assert top1.capacity == 4 and bool(top1.kept.all())
    assert torch.equal(top1.gate[:, 0], torch.softmax(logits, -1).max(-1).values)  # Switch: p_i


def test_load_balancing_loss_uniform_and_collapsed() -> None:
    # Uniform probabilities: P_i = 1/E whatever f is, so E·Σ f_i/E = 1 (Switch's minimum).
    assert load_balancing_loss(route(torch.zeros(10, E))).item() == pytest.approx(1.0)
    # Every token sure of expert 0: f = (1, 0, …), P_0 → 1, the loss → E.
    collapsed = torch.tensor([[20.0, 0.0, 0.0, 0.0]]).repeat(8, 1)
    assert load_balancing_loss(route(collapsed)).item() == pytest.approx(E, rel=1e-6)
    assert load_balancing_loss(route(torch.zeros(0, E))).item() == 0.0


@pytest.mark.parametrize("top_k", [1, 2])
@pytest.mark.parametrize("pad", [False, True])
@pytest.mark.parametrize("capacity_factor", [1.0, None])
def test_layer_equals_token_by_token_reference(top_k: int, pad: bool,
                                               capacity_factor: float | None) -> None:
    sizes = [5, 9, 0, 7]
    x = torch.randn(sum(sizes), D, generator=torch.Generator().manual_seed(3),
                    dtype=torch.float64)
    w = torch.randn(sum(sizes), D, generator=torch.Generator().manual_seed(4),
                    dtype=torch.float64)
    moe, twin = (MoELayer(D, FF, E, top_k=top_k, capacity_factor=capacity_factor, pad=pad,
                          seed=1, dtype=torch.float64) for _ in range(2))
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = moe(xa, group_sizes=sizes)
    y_ref, aux_ref = reference(twin, xb, sizes)
    assert same(out.y, y_ref)
    assert same(out.aux_loss, aux_ref)
    ((out.y * w).sum() + out.aux_loss).backward()
    ((y_ref * w).sum() + aux_ref).backward()
    assert same(xa.grad, xb.grad)
    for mine, ref in zip(moe.parameters(), twin.parameters()):
        assert same(mine.grad, ref.grad)
    stats = out.stats
    assert stats.tokens == sum(sizes) and sum(stats.load) == top_k * sum(sizes)
    if capacity_factor is None:
        assert stats.dropped == 0
    elif top_k == 1:
        assert stats.dropped > 0  # these seeds overflow an expert: the drop path is exercised


def test_flops_match_the_formula_ragged_and_padded() -> None:
    T = 24
    x = torch.randn(T, D, generator=torch.Generator().manual_seed(0))
    for pad in (False, True):
        moe = MoELayer(D, FF, E, top_k=2, capacity_factor=1.5, pad=pad, seed=2)
        with FlopCounterMode(display=False) as counter:
            out = moe(x)
        rows = out.stats.slots if pad else sum(out.stats.kept)
        # Router (T, d) @ (d, E), then two matmuls per expert row: 2·d·f each.
        assert counter.get_total_flops() == 2 * T * D * E + rows * 4 * D * FF
    dense = torch.nn.Sequential(torch.nn.Linear(D, FF), torch.nn.GELU(), torch.nn.Linear(FF, D))
    with FlopCounterMode(display=False) as counter:
        dense(x)
    assert counter.get_total_flops() == T * 4 * D * FF  # a top-2 MoE: ~2× this, not E×


def test_experts_slice_and_errors() -> None:
    bank = Experts(4, D, FF, generator=torch.Generator().manual_seed(0))
    part = bank.slice(2, 2)
    assert part.first == 2 and torch.equal(part.w1, bank.w1[2:4])
    with pytest.raises(ValueError, match=r"experts \[3, 5\) are not all in this bank of 4"):
        bank.slice(3, 2)
    with pytest.raises(ValueError, match="counts must give the rows of each of the 4"):
        bank(torch.zeros(3, D), [1, 2])
    with pytest.raises(ValueError, match="top_k .* must be an int in 1 … 4"):
        route(torch.zeros(3, 4), top_k=5)
    with pytest.raises(ValueError, match="logits must be"):
        route(torch.zeros(3))
    with pytest.raises(ValueError, match="group_sizes must be counts"):
        MoELayer(D, FF, E)(torch.zeros(5, D), group_sizes=[2, 2])
    r = route(torch.zeros(3, E))
    with pytest.raises(ValueError, match="dispatch: x must be"):
        dispatch(torch.zeros(4, D), r)
