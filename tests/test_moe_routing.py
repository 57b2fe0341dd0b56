"""The routers of 2024-25 in toolkit.expert_parallel, against plain single-process arithmetic:
sigmoid scores and the balancing bias (the choice moves, the gates do not), node-limited routing
worked by hand, ST-MoE's z-loss and its float32 arithmetic, the bias update and MaxVio, shared
experts token by token, DeepSeekMoE's fine-grained shapes (and their unchanged parameters and
FLOPs), bytes across nodes, Megatron-Core's folded groups and the planner's headroom; then on
real ranks: the bias update over 4 ranks equal to one process with one all-reduce of 8·E bytes a
step, shared experts and sigmoid scores through expert parallelism, and node-limited routing
with the bytes sent to other nodes recorded against the formula.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from toolkit.cost.experts import cross_node_bytes, fine_grained, step_bytes
from toolkit.experiments.expert_parallel import compare
from toolkit.experiments.moe_routing import balance_on_ranks
from toolkit.expert_parallel import (
    MoELayer, dense_parameters, expert_parameters, load_balancing_loss, max_violation,
    node_limited_mask, nodes_touched, route, router_z_loss, simulate, update_bias,
)
from toolkit.planner import Layout, cluster, moe_shape
from toolkit.planner.experts import MEMORY_HEADROOM, folded_groups, predict_moe

TIMEOUT = 60


def test_sigmoid_scores_gate_over_the_chosen_and_the_bias_only_steers() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 0.5, 3.0, 1.0]])
    s = torch.sigmoid(logits)
    r = route(logits, top_k=2, capacity_factor=None, score="sigmoid")
    assert r.expert.tolist() == [[0, 1], [2, 3]]
    assert torch.allclose(r.probs, s)
    assert torch.allclose(r.gate[0], s[0, :2] / s[0, :2].sum())    # normalised over the k
    # A bias of +1 on expert 3 makes it the first choice of token 0, but its gate is still its
    # own sigmoid score over the chosen pair's (DeepSeek-V3 §2.1.2).
    b = torch.tensor([0.0, 0.0, 0.0, 1.0])
    rb = route(logits, top_k=2, capacity_factor=None, score="sigmoid", bias=b)
    assert rb.expert.tolist() == [[3, 0], [3, 2]]
    assert torch.allclose(rb.gate[0], torch.stack([s[0, 3], s[0, 0]]) / (s[0, 3] + s[0, 0]))
    # Softmax, k = 1: Switch's gate is the probability itself, whatever the bias chose.
    # p = (0.644, …, 0.032) and (…, 0.789, 0.107): +0.65 wins token 0 over, not token 1.
    r1 = route(logits, top_k=1, capacity_factor=None, bias=0.65 * b)
    assert r1.expert[:, 0].tolist() == [3, 2]
    assert torch.allclose(r1.gate[:, 0], torch.softmax(logits, -1)[[0, 1], [3, 2]])
    # Switch's loss on sigmoid scores normalises them first (DeepSeek-V3's sequence-wise form).
    f = torch.bincount(r.expert[:, 0], minlength=4).float() / 2
    want = 4 * (f * (s / s.sum(-1, keepdim=True)).mean(0)).sum()
    assert torch.allclose(load_balancing_loss(r), want)
    with pytest.raises(ValueError, match="score must be one of"):
        route(logits, score="tanh")
    with pytest.raises(ValueError, match=r"bias must have one entry per expert \(4,\)"):
        route(logits, bias=torch.zeros(3))


def test_node_limited_routing_by_hand() -> None:
    # E = 8 experts on 4 nodes of 2; k = 4, at most M = 2 nodes: a node's score is the sum of the
    # token's best ⌈4/2⌉ = 2 scores there.
    scores = torch.tensor([[0.9, 0.1, 0.5, 0.5, 0.8, 0.0, 0.3, 0.3]])
    # Node sums: 1.0, 1.0, 0.8, 0.6: nodes 0 and 1 (the unlimited top-4 would take expert 4).
    mask = node_limited_mask(scores, top_k=4, nodes=4, max_nodes=2)
    assert mask.tolist() == [[True, True, True, True, False, False, False, False]]
    r = route(torch.logit(scores.clamp(1e-6, 1 - 1e-6)), top_k=4, capacity_factor=None,
              score="sigmoid", nodes=4, max_nodes=2)
    assert sorted(r.expert[0].tolist()) == [0, 1, 2, 3]
    unlimited = route(torch.logit(scores.clamp(1e-6, 1 - 1e-6)), top_k=4, capacity_factor=None,
                      score="sigmoid")
    assert 4 in unlimited.expert[0].tolist()
    logits = torch.randn(200, 16, generator=torch.Generator().manual_seed(0))
    for m in (2, 3):
        r = route(logits, top_k=6, capacity_factor=None, nodes=4, max_nodes=m)
        assert nodes_touched(r.expert, num_experts=16, nodes=4).max().item() <= m
    assert nodes_touched(route(logits, top_k=6, capacity_factor=None).expert, num_experts=16,
                         nodes=4).max().item() > 3
    with pytest.raises(ValueError, match="do not fit on max_nodes=1 nodes of 2 experts"):
        node_limited_mask(scores, top_k=4, nodes=4, max_nodes=1)
    with pytest.raises(ValueError, match="cannot be split into 3 equal nodes"):
        node_limited_mask(scores, top_k=2, nodes=3, max_nodes=1)


def test_router_z_loss_is_the_squared_logsumexp_in_float32() -> None:
    logits = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    want = ((math.log(math.e + math.e ** 2 + math.e ** 3)) ** 2 + math.log(3) ** 2) / 2
    assert router_z_loss(logits).item() == pytest.approx(want, rel=1e-12)
    z16 = router_z_loss(logits.to(torch.bfloat16))
    assert z16.dtype == torch.float32                       # never computed in 16 bits
    assert router_z_loss(torch.zeros(0, 3)).item() == 0.0
    # Its gradient pulls every logit down by 2·lse·softmax / T.
    x = logits.clone().requires_grad_()
    router_z_loss(x).backward()
    lse = torch.logsumexp(logits, -1, keepdim=True)
    assert torch.allclose(x.grad, 2 * lse * torch.softmax(logits, -1) / 2)


def test_bias_update_and_max_violation_by_hand() -> None:
    bias = torch.zeros(4, dtype=torch.float64)
    load = torch.tensor([10, 2, 4, 4])                      # mean 5
    assert update_bias(bias, load, rate=0.1).tolist() == [-0.1, 0.1, 0.1, 0.1]
    assert update_bias(bias, torch.tensor([5, 5, 5, 5]), rate=0.1).tolist() == [0, 0, 0, 0]
    assert max_violation([10, 2, 4, 4]) == pytest.approx(1.0)
    assert max_violation([0, 0]) == 0.0
    with pytest.raises(ValueError, match="rate must be a number >= 0"):
        update_bias(bias, load, rate=-1)
    with pytest.raises(ValueError, match="bias and load must both be"):
        update_bias(bias, torch.tensor([1, 2]), rate=0.1)


def test_simulated_bias_balances_a_skewed_router() -> None:
    gen = torch.Generator().manual_seed(1)
    tilt = torch.linspace(1.0, -1.0, 8, dtype=torch.float64)
    batches = [torch.randn(256, 8, generator=gen, dtype=torch.float64) + tilt
               for _ in range(60)]
    loads, biases = simulate(batches, top_k=2, rate=0.01)
    plain, _ = simulate(batches, top_k=2, rate=0.0)
    assert all(int(load.sum()) == 512 for load in loads)
    before = sum(max_violation(x) for x in plain[-10:]) / 10
    after = sum(max_violation(x) for x in loads[-10:]) / 10
    assert before > 1.0 and after < before / 3
    assert biases[-1][0] < 0 < biases[-1][-1]               # the favoured expert is held back


def test_shared_experts_token_by_token_and_kept_with_the_dense_parameters() -> None:
    d, f = 6, 10
    x = torch.randn(9, d, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    moe = MoELayer(d, f, 4, top_k=2, capacity_factor=None, num_shared=2, seed=3,
                   dtype=torch.float64)
    out = moe(x)
    plain = MoELayer(d, f, 4, top_k=2, capacity_factor=None, seed=3, dtype=torch.float64)
    sh = moe.shared
    extra = sum(F.gelu(x @ sh.w1[i] + sh.b1[i]) @ sh.w2[i] + sh.b2[i] for i in range(2))
    # The routed part is the plain layer's (same seed: the shared weights are drawn after).
    assert (out.y - plain(x).y - extra).abs().max().item() < 1e-12
    shared_ids = {id(p) for p in sh.parameters()}
    assert not shared_ids & {id(p) for p in expert_parameters(moe)}
    assert shared_ids <= {id(p) for p in dense_parameters(moe)}
    out.y.sum().backward()
    assert all(p.grad is not None for p in sh.parameters())


def test_expert_bias_buffer_steers_the_layer() -> None:
    moe = MoELayer(4, 8, 4, top_k=1, capacity_factor=None, expert_bias=True, seed=0)
    assert moe.expert_bias.tolist() == [0, 0, 0, 0] and "expert_bias" in dict(moe.named_buffers())
    moe.expert_bias[2] = 10.0                               # every token now chooses expert 2
    out = moe(torch.randn(12, 4, generator=torch.Generator().manual_seed(0)))
    assert out.stats.load == (0, 0, 12, 0)
    assert not any(p is moe.expert_bias for p in moe.parameters())


def test_fine_grained_shapes_keep_parameters_and_flops() -> None:
    # DeepSeekMoE §3.1: 16 experts, top-2 → 120 combinations; each split in 4 → 64, top-8.
    assert fine_grained(16, 2, 4096, segments=1)["combinations"] == 120
    fg = fine_grained(16, 2, 4096, segments=4)
    assert (fg["routed"], fg["top_k"], fg["d_ff"]) == (64, 8, 1024)
    assert fg["combinations"] == 4_426_165_368
    sh = fine_grained(16, 2, 4096, segments=4, shared=1)
    assert (sh["routed"], sh["top_k"], sh["shared"]) == (63, 7, 1)
    with pytest.raises(ValueError, match="cannot be split into 3 equal experts"):
        fine_grained(16, 2, 4096, segments=3)
    # The layers themselves: same expert parameters, same expert FLOPs per token.
    d, x = 8, torch.randn(32, 8, generator=torch.Generator().manual_seed(0))
    coarse = MoELayer(d, 64, 4, top_k=1, capacity_factor=None)
    fine = MoELayer(d, 16, 16, top_k=4, capacity_factor=None)
    shared = MoELayer(d, 16, 15, top_k=3, capacity_factor=None, num_shared=1)
    counts = []
    for m in (coarse, fine, shared):
        with FlopCounterMode(display=False) as counter:
            m(x)
        router = 2 * 32 * d * m.num_experts
        counts.append(counter.get_total_flops() - router)
    assert counts == [32 * 4 * d * 64] * 3
    weights = [sum(p.numel() for n, p in m.named_parameters() if n.endswith(("w1", "w2")))
               for m in (coarse, fine, shared)]
    assert weights == [4 * 2 * d * 64] * 3


def test_cross_node_bytes_by_hand() -> None:
    # 4 ranks in 2 nodes of 2, one expert per rank; rows[r][e] rows from rank r to expert e.
    rows = [[1, 2, 3, 4], [0, 1, 0, 1], [2, 0, 0, 2], [1, 1, 1, 1]]
    out = cross_node_bytes(rows, ranks_per_node=2, hidden=4, elem_bytes=2)
    # Rank 0 (node 0) sends 3 + 4 rows to experts 2, 3 and receives 2 + 1 rows from ranks 2, 3.
    assert (out[0]["send_rows"], out[0]["recv_rows"]) == (7, 3)
    assert out[0]["step"] == 2 * 8 + 2 * (7 + 3) * 4 * 2
    # One node holding every rank: nothing crosses, as the all-rank formula says it all stays.
    assert all(o["step"] == 0 for o in cross_node_bytes(rows, ranks_per_node=4, hidden=4,
                                                         elem_bytes=2))
    wire = step_bytes(rows, hidden=4, elem_bytes=2)
    assert all(o["step"] <= w["step_wire"] for o, w in zip(out, wire))
    with pytest.raises(ValueError, match="must divide the 4 ranks"):
        cross_node_bytes(rows, ranks_per_node=3, hidden=4, elem_bytes=2)


def test_folded_groups() -> None:
    layout = Layout(dp=4, tp=2, ep=4)
    plain = folded_groups(layout)
    assert plain["ep"] == layout.groups("ep") and plain["edp"] == layout.groups("edp")
    assert plain["etp"] == [[r] for r in range(8)]
    # etp = 2, ep = 2 over a stage of 4 ranks: edp = 4 / (2 · 2) = 1 (= world / (ep·etp·pp)).
    folded = folded_groups(Layout(dp=2, tp=2, ep=2), etp=2)
    assert folded == {"etp": [[0, 1], [2, 3]], "ep": [[0, 2], [1, 3]],
                      "edp": [[0], [1], [2], [3]]}
    two_stages = folded_groups(Layout(dp=4, pp=2, ep=2), etp=2)
    assert two_stages["edp"] == [[0], [1], [2], [3], [4], [5], [6], [7]]
    assert two_stages["ep"][-1] == [5, 7]
    with pytest.raises(ValueError, match="ep × etp = 4 × 2 must divide the 4 ranks"):
        folded_groups(Layout(dp=4, ep=4), etp=2)


def test_the_planner_keeps_headroom() -> None:
    dgx, mixtral = cluster("dgx-h100", nodes=8), moe_shape("mixtral-8x7b")
    layout = Layout(dp=64, ep=8, zero=1, micro_batches=8, attention="flash")
    kw = dict(global_batch=512, seq_len=4096)
    p = predict_moe(mixtral, dgx, layout, **kw)
    used = p.memory / dgx.memory_bytes
    assert 1 - MEMORY_HEADROOM < used < 1                  # fits the card, not with the margin
    assert predict_moe(mixtral, dgx, layout, headroom=0.0, **kw).fits and not p.fits
    assert predict_moe(mixtral, dgx, layout, headroom=1 - used - 1e-3, **kw).fits
    with pytest.raises(ValueError, match="headroom must be a share of memory in"):
        predict_moe(mixtral, dgx, layout, headroom=1.0, **kw)


@pytest.mark.multirank
def test_bias_balancing_on_four_ranks_equals_one_process() -> None:
    steps, experts = 30, 8
    run = balance_on_ranks(4, steps=steps, tokens=48, num_experts=experts, top_k=2, rate=0.02,
                           timeout=TIMEOUT)
    assert run.ranks_agree
    assert torch.equal(run.loads, run.reference)
    assert torch.equal(run.bias, run.reference_bias)
    assert (run.loads.sum(1) == 4 * 48 * 2).all()
    for calls in run.calls.values():                        # one all-reduce of E int64 a step
        assert calls == [("all_reduce", 8 * experts)] * steps
    assert max(run.violation()[-5:]) < min(run.violation("unbalanced")[-5:])


@pytest.mark.multirank
def test_shared_experts_and_sigmoid_scores_through_expert_parallelism() -> None:
    run = compare(d_model=8, d_ff=12, num_experts=4, top_k=2, capacity_factor=1.0,
                  tokens=[9, 5, 0, 7], score="sigmoid", num_shared=1, method="p2p",
                  timeout=TIMEOUT)
    assert max(run.errors.values()) < 1e-12, run.errors
    assert "shared_grad" in run.errors
    assert (run.traffic.forward_recorded == run.traffic.forward_formula).all()


@pytest.mark.multirank
def test_node_limited_routing_on_two_nodes_of_two_ranks() -> None:
    kw = dict(d_model=8, d_ff=12, num_experts=8, top_k=4, capacity_factor=None,
              tokens=[10, 7, 12, 5], method="p2p", ranks_per_node=2, timeout=TIMEOUT)
    limited = compare(max_nodes=1, **kw)
    assert max(limited.errors.values()) < 1e-12, limited.errors
    t = limited.traffic
    assert (t.cross_node_recorded == t.cross_node_formula).all(), t
    free = compare(**kw)
    assert (free.traffic.cross_node_recorded == free.traffic.cross_node_formula).all()
    assert limited.stats.load != free.stats.load        # the limit changed where tokens went
