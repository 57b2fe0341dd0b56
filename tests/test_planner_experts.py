"""The planner's expert-parallel axis: Layout's ep (validation, groups, spans, labels), MoEShape's
counts against Mixtral's published ones, predict_moe's terms on values worked out by hand, and
plan_moe's ranking.
"""

from __future__ import annotations

import pytest

from toolkit import planner
from toolkit.cost import AlphaBeta
from toolkit.memory import MIXED_ADAM, GiB, model_state_bytes
from toolkit.planner import Layout, MoEShape, moe_shape, plan_moe, predict_moe

LINK = AlphaBeta(alpha=100e-6, beta=1e-9)
TINY = MoEShape("tiny", layers=2, hidden=8, heads=2, vocab=16, seq_len=4, num_experts=4,
                top_k=2, expert_ffn=16, gated=False)
LAPTOP = planner.Cluster("four ranks", 4, 2 * GiB, intra=LINK, inter=LINK, peak_flops=1e9)


def test_layout_ep_groups_spans_and_labels() -> None:
    d = Layout(dp=4, ep=2)
    assert d.groups("ep") == [[0, 1], [2, 3]] and d.groups("edp") == [[0, 2], [1, 3]]
    assert (d.edp, d.span("ep"), d.span("edp")) == (2, 2, 4)
    assert d.label() == "dp4·tp1·pp1·ep2 z0 m1"
    folded = Layout(dp=2, tp=2, pp=2, ep=4)  # ep over tp × dp of each stage
    assert folded.groups("ep") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert folded.groups("edp") == [[r] for r in range(8)]
    assert Layout(dp=4).ep == 1 and Layout(dp=4).groups("dp") == [[0, 1, 2, 3]]
    with pytest.raises(ValueError, match="ep=3 must divide the ranks of one pipeline stage"):
        Layout(dp=4, ep=3)
    with pytest.raises(ValueError, match="axis must be one of"):
        d.groups("expert")


def test_mixtral_counts_against_the_paper() -> None:
    m = moe_shape("mixtral-8x7b")
    h, f, v = 4096, 14336, 32000
    layer = 2 * h * h + 2 * h * 1024 + 2 * h + h * 8  # attention (8 kv heads of 128), norms, router
    assert m.num_params == 32 * (layer + 8 * 3 * h * f) + 2 * v * h + h
    assert m.active_params == 32 * (layer + 2 * 3 * h * f) + 2 * v * h + h
    assert m.num_params / m.published == pytest.approx(1, abs=0.01)         # 46.70B vs "47B"
    assert m.active_params / m.published_active == pytest.approx(1, abs=0.01)  # 12.88B vs 13B
    # FLOPs per token: 6·N_active (matrices, head included, embedding lookup not) + 12·L·h·s.
    n_mm = 32 * (2 * h * h + 2 * h * 1024 + h * 8 + 2 * 3 * h * f) + v * h
    assert m.flops_per_token(seq_len=4096) == 6 * n_mm + 12 * 32 * h * 4096
    with pytest.raises(ValueError, match="unknown MoE model"):
        moe_shape("gpt4")


def test_predict_moe_terms_by_hand() -> None:
    d = Layout(dp=4, ep=2)
    p = predict_moe(TINY, LAPTOP, d, global_batch=4)  # b = 1 sequence of 4 tokens per rank
    # Experts: 2 layers × 2 of the 4 experts × 2·8·16 weights, replicated over edp = 2.
    experts = 2 * 2 * 2 * 8 * 16
    assert p.expert_states == model_state_bytes(experts, 1, 0, MIXED_ADAM).total
    nonexpert = 2 * (4 * 8 * 8 + 2 * 8 + 8 * 4) + 2 * 16 * 8 + 8
    assert p.states == p.expert_states + model_state_bytes(nonexpert, 4, 0, MIXED_ADAM).total
    # 4 all-to-alls per MoE layer of k·T·h·2 = 2·4·8·2 bytes: (ep − 1)α + (ep − 1)/ep·nβ each.
    n = 2 * 4 * 8 * 2
    assert p.ep_comm == pytest.approx(2 * 4 * (100e-6 + n / 2 * 1e-9))
    # Expert gradients: ring all-reduce over edp = 2 of 2 bytes each; the rest over dp = 4.
    ar = lambda nbytes, q: 2 * (q - 1) * 100e-6 + 2 * (q - 1) / q * nbytes * 1e-9  # noqa: E731
    assert p.dp_comm == pytest.approx(ar(2 * nonexpert, 4) + ar(2 * experts, 2))
    assert predict_moe(TINY, LAPTOP, Layout(dp=4), global_batch=4).ep_comm == 0.0
    # cf = 2 doubles the expert rows: all-to-all bytes and expert FLOPs.
    p2 = predict_moe(TINY, LAPTOP, d, global_batch=4, capacity_factor=2.0)
    assert p2.ep_comm == pytest.approx(2 * 4 * (100e-6 + 2 * n / 2 * 1e-9))
    extra_flops = 6 * 2 * 2 * (2 * 8 * 16) * 16  # 6 · layers · k rows · expert matmuls · tokens
    assert (p2.compute - p.compute) * 4 * 1e9 * 0.5 == pytest.approx(extra_flops)


def test_experts_shard_over_ep() -> None:
    m = moe_shape("mixtral-8x7b")
    dgx = planner.cluster("dgx-h100", nodes=8)
    states = {ep: predict_moe(m, dgx, Layout(dp=64, ep=ep, zero=1, micro_batches=8),
                              global_batch=512, seq_len=4096) for ep in (1, 2, 4, 8)}
    for ep, p in states.items():  # ZeRO-1 over edp = 64/ep: 4 bytes + 12/edp per parameter
        params = 32 * (8 // ep) * 3 * 4096 * 14336
        assert p.expert_states == pytest.approx(params * (4 + 12 / (64 // ep)))
    assert states[8].ep_comm > states[2].ep_comm > states[1].ep_comm == 0
    with pytest.raises(ValueError, match="num_experts=8 is not divisible by 16"):
        predict_moe(m, dgx, Layout(dp=64, ep=16), global_batch=512)
    with pytest.raises(ValueError, match="tp > 1 needs sequence_parallel"):
        predict_moe(m, dgx, Layout(dp=32, tp=2, sequence_parallel=False), global_batch=512)
    with pytest.raises(ValueError, match="use planner.predict_moe"):
        planner.predict("gpt2-small", dgx, Layout(dp=64, ep=2), global_batch=64)


def test_plan_moe_ranks_fitting_layouts_first() -> None:
    m = moe_shape("mixtral-8x7b")
    table = plan_moe(m, planner.cluster("dgx-h100", nodes=4), global_batch=256, seq_len=4096,
                     micro_batches=[8], zero_stages=(1,), recompute=("full",))
    assert set(table.ep) == {1, 2, 4, 8} and (8 % table.ep == 0).all()
    fits = table[table.fits]
    assert table.fits.iloc[0] and (table.fits.iloc[:len(fits)]).all()
    assert fits.step.is_monotonic_increasing
    best = table.layout.iloc[0]
    assert best.ep == table.ep.iloc[0] and best.edp == table.edp.iloc[0]
    assert (table.experts_GiB <= table.states_GiB).all()
