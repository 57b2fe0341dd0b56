"""toolkit.planner: clusters and layouts validated, predictions equal to hand-checked numbers and
to toolkit.memory / toolkit.pipeline, infeasible layouts flagged (with the stated memory
headroom), a sensible ranking, and one real dp × tp run on 2 gloo ranks."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from toolkit import memory
from toolkit.cost import AlphaBeta
from toolkit.flops import flops_per_token
from toolkit.models import GPTConfig
from toolkit.pipeline import bubble_fraction
from toolkit.planner import (
    CLUSTERS, Layout, as_shape, cluster, laptop, layouts, plan, predict, stage_params,
)

DGX = cluster("dgx-a100-80gb")  # one node, 8 GPUs
SLOW = AlphaBeta(alpha=1e-4, beta=1e-9)


def test_cluster_is_validated_and_resized():
    assert DGX.world_size == 8 and DGX.peak_flops == 312e12 and DGX.memory_bytes == 80 * 2 ** 30
    assert cluster("dgx-h100", nodes=4).world_size == 32
    assert DGX.with_gpus(2).gpus_per_node == 2 and DGX.with_gpus(64).nodes == 8
    assert all(c.source for c in CLUSTERS.values())
    with pytest.raises(ValueError, match="whole number of 8-GPU nodes"):
        DGX.with_gpus(12)
    with pytest.raises(ValueError, match="gpus_per_node must be an int >= 1"):
        dataclasses.replace(DGX, gpus_per_node=0)
    with pytest.raises(ValueError, match="peak_flops must be a number > 0"):
        dataclasses.replace(DGX, peak_flops=0)
    with pytest.raises(ValueError, match="unknown preset"):
        cluster("dgx-z9000")
    assert DGX.link(8) is DGX.intra and cluster("dgx-h100", nodes=2).link(16).beta == 1 / 50e9


def test_layout_validates_and_numbers_ranks_tp_fastest():
    d = Layout(dp=2, tp=2)
    assert d.check(4) is d and d.world_size == 4
    with pytest.raises(ValueError, match="dp × tp × pp × cp = 2 × 2 × 1 × 1 = 4, expected"):
        d.check(8)
    for bad in (dict(dp=0), dict(tp=1.5), dict(zero=4), dict(recompute="some")):
        with pytest.raises(ValueError, match="Layout"):
            Layout(**bad)
    assert d.groups("tp") == [[0, 1], [2, 3]] and d.groups("dp") == [[0, 2], [1, 3]]
    big = Layout(dp=2, tp=2, pp=2, cp=2)
    assert all(big.rank(**big.coords(r)) == r for r in range(16))
    assert big.coords(13) == {"pp": 1, "dp": 1, "cp": 0, "tp": 1}
    assert big.span("tp") == 2 and big.span("cp") == 4 and big.span("dp") == 8
    assert big.span("pp") == 16 and sorted(sum(big.groups("pp"), [])) == list(range(16))


def test_shapes_from_names_and_configs():
    assert as_shape("gpt2-xl") is memory.model_shape("gpt2-xl")
    cfg = GPTConfig(n_layer=3, d_model=32, n_head=4, vocab_size=64, seq_len=16)
    from toolkit.models import TinyGPT, count_parameters
    assert as_shape(cfg).num_params == count_parameters(TinyGPT(cfg))
    with pytest.raises(ValueError, match="d_ff = 4·d_model"):
        as_shape(dataclasses.replace(cfg, d_ff=100))


@pytest.mark.parametrize("zero", [0, 1, 2])
def test_memory_at_pp1_equals_toolkit_memory_budget(zero):
    # gpt2-large, dp = 4, tp = 2 on one DGX node, 16 sequences of 1024 in 2 micro-batches: b = 2.
    d = Layout(dp=4, tp=2, zero=zero, micro_batches=2)
    p = predict("gpt2-large", DGX, d, global_batch=16)
    want = memory.budget("gpt2-large", n_d=4, stage=zero, batch=2, tensor_parallel=2,
                         sequence_parallel=True)
    assert p.states == pytest.approx(want.model_states, rel=1e-12)
    assert p.activations == pytest.approx(want.activations, rel=1e-12)
    assert p.buffers == 0 and p.memory == pytest.approx(want.total, rel=1e-12)
    if zero == 0:  # 16 bytes per parameter, half of them here: 8Ψ
        assert p.states == 8 * memory.model_shape("gpt2-large").num_params


def test_pipeline_memory_holds_the_first_stage_and_min_p_m_micro_batches():
    shape = memory.model_shape("gpt2-medium")  # 24 layers, h = 1024
    h, s = shape.hidden, shape.seq_len
    d = Layout(dp=2, pp=4, micro_batches=8)  # b = 32 / 16 = 2
    p = predict(shape, DGX, d, global_batch=32)
    per_stage = 6 * (12 * h * h + 13 * h) + shape.vocab * h + s * h
    assert stage_params(shape, 4) == per_stage
    assert p.states == pytest.approx(16 * per_stage)
    one = memory.activation_bytes_per_layer(seq_len=s, batch=2, hidden=h, heads=16)
    assert p.activations == pytest.approx(6 * one * 4)  # 1F1B: min(p, m) = 4 in flight


def test_recompute_keeps_inputs_plus_one_layer_and_zero3_adds_gathered_layers():
    base = dict(global_batch=8)
    plain = predict("gpt2-large", DGX, Layout(dp=8), **base)
    rc = predict("gpt2-large", DGX, Layout(dp=8, recompute="full"), **base)
    shape = memory.model_shape("gpt2-large")
    sbh = shape.seq_len * 1 * shape.hidden
    assert rc.activations == pytest.approx(36 * 2 * sbh + plain.activations / 36)
    assert rc.activations < plain.activations / 5
    assert rc.compute == pytest.approx(plain.compute * 4 / 3, rel=0.02)  # one more forward
    z3 = predict("gpt2-large", DGX, Layout(dp=8, zero=3), **base)
    assert z3.buffers == 2 * (12 * 1280 ** 2 + 13 * 1280) * 2


def test_selective_flash_and_context_parallel_activations_follow_toolkit_memory():
    shape = memory.model_shape("gpt2-large")  # 36 layers, h = 1280, 20 heads, s = 1024
    L, s, h, a = shape.layers, shape.seq_len, shape.hidden, shape.heads
    base = dict(global_batch=8)

    def act(**kw):
        return memory.activation_bytes_per_layer(seq_len=s, batch=1, hidden=h, heads=a, **kw)

    sel = predict(shape, DGX, Layout(dp=8, recompute="selective"), **base)
    flash = predict(shape, DGX, Layout(dp=8, attention="flash"), **base)
    plain = predict(shape, DGX, Layout(dp=8), **base)
    # Selective: every layer keeps 34·s·b·h, plus one layer's scores while it is rerun.
    assert sel.activations == pytest.approx(L * 34 * s * h + 5 * a * s * s, rel=1e-12)
    assert flash.activations == pytest.approx(L * 34 * s * h, rel=1e-12)
    assert plain.activations == pytest.approx(L * act(), rel=1e-12)
    # Selective recomputes the attention core (4·L·h·s FLOPs per token): HFU counts it.
    assert sel.compute > flash.compute == plain.compute
    assert sel.hfu / sel.mfu == pytest.approx(sel.compute / plain.compute, rel=1e-12)
    assert plain.hfu == plain.mfu and flash.hfu == flash.mfu
    assert Layout(dp=8, recompute="selective", attention="flash").label().endswith("sel flash")
    # Context parallel over 4 ranks: s/4 queries per rank, each against all s keys.
    cp = predict(shape, DGX, Layout(dp=2, cp=4), **base)  # b = 4
    assert cp.activations == pytest.approx(L * 4 * act(context_parallel=4), rel=1e-12)
    assert cp.activations == pytest.approx(L * 4 * act() / 4, rel=1e-12)  # linear in cp
    quadratic = memory.activation_bytes_per_layer(seq_len=s // 4, batch=4, hidden=h, heads=a)
    assert cp.activations > L * quadratic  # the old act(s/cp) undercounted the scores
    with pytest.raises(ValueError, match="attention must be one of"):
        Layout(attention="fused")


def test_time_terms_equal_the_formulas():
    cfg = GPTConfig(vocab_size=64, seq_len=64, d_model=128, n_head=4, n_layer=4)
    here = laptop(link=SLOW, peak_flops=1e10, ranks=4)
    B = 16
    d = Layout(dp=2, tp=2)
    p = predict(cfg, here, d, global_batch=B, efficiency=1.0, elem_bytes=4,
                recipe=memory.SGD)
    assert p.model_flops == flops_per_token(cfg) * B * 64
    assert p.compute == pytest.approx(p.model_flops / 4 / 1e10)
    n = 8 * 64 * 128 * 4  # one (b, s, h) fp32 activation, b = 8
    ring2 = 2 * SLOW.alpha + n * SLOW.beta  # ring all-reduce on 2 ranks: 2α + nβ
    assert p.tp_comm == pytest.approx(4 * 4 * ring2)  # 4 per layer, 4 layers
    grads = as_shape(cfg).num_params / 2 * 4
    assert p.dp_comm == pytest.approx(2 * SLOW.alpha + grads * SLOW.beta)
    assert p.step == pytest.approx(p.compute + p.tp_comm + p.dp_comm)
    assert p.mfu == pytest.approx(p.model_flops / (p.step * 4 * 1e10))
    assert p.bubble == 0 and p.pp_comm == 0


@pytest.mark.parametrize("pp,m", [(2, 1), (4, 8), (8, 64)])
def test_bubble_term_is_p_minus_1_over_m_plus_p_minus_1(pp, m):
    node = DGX.with_gpus(pp)
    p = predict("gpt2-medium", node, Layout(pp=pp, micro_batches=m), global_batch=64)
    pipeline = p.step - p.dp_comm
    assert p.bubble / pipeline == pytest.approx((pp - 1) / (m + pp - 1))
    assert p.bubble_fraction == bubble_fraction("1f1b", p=pp, m=m)


def test_tensor_parallel_inside_a_node_uses_the_fast_link():
    two = cluster("dgx-a100-80gb", nodes=2)
    inside = predict("zero-7.5b", two, Layout(dp=2, tp=8), global_batch=16)
    across = predict("zero-7.5b", dataclasses.replace(two, gpus_per_node=4, nodes=4),
                     Layout(dp=2, tp=8), global_batch=16)
    assert across.tp_comm > 5 * inside.tp_comm  # 25 GB/s InfiniBand against 300 GB/s NVLink
    assert {d.tp for d in layouts(as_shape("gpt2-xl"), two, global_batch=16, seq_len=1024)} \
        == {1}  # 25 heads: tp must divide them and the node's 8 GPUs
    assert {d.tp for d in layouts(as_shape("gpt2-large"), two, global_batch=16, seq_len=1024)} \
        == {1, 2, 4}  # 20 heads


def test_errors_name_what_does_not_divide():
    with pytest.raises(ValueError, match="heads=25 is not divisible by 2"):
        predict("gpt2-xl", DGX, Layout(dp=4, tp=2), global_batch=16)
    with pytest.raises(ValueError, match="global_batch=10 is not divisible by 8"):
        predict("gpt2-small", DGX, Layout(dp=8), global_batch=10)
    with pytest.raises(ValueError, match="expected the world size 8"):
        predict("gpt2-small", DGX, Layout(dp=4), global_batch=16)


def test_small_model_on_one_node_pure_dp_wins():
    table = plan("gpt2-small", DGX, global_batch=64)
    best = table.iloc[0]
    assert best.fits and (best.dp, best.tp, best.pp) == (8, 1, 1)
    assert best.recompute == "none" and 0.3 < best.mfu <= 0.5
    fit = table[table.fits]
    assert (fit.step.diff().dropna() >= 0).all()  # ranked by step time
    assert table.fits.is_monotonic_decreasing   # every fit before every misfit
    assert (table.mfu <= 0.5 + 1e-9).all()       # nothing beats the assumed efficiency


def test_gpt3_on_1024_a100s_pure_dp_does_not_fit_megatron_does():
    big = cluster("dgx-a100-80gb", nodes=128)
    table = plan("gpt3-175b", big, global_batch=1024)
    pure = table[(table.tp == 1) & (table.pp == 1)]
    assert len(pure) and not pure[pure.zero < 3].fits.any()          # 16Ψ/… ≥ 1 TB
    assert not pure[pure.recompute == "none"].fits.any()             # 275 GiB of activations
    z0 = predict("gpt3-175b", big, Layout(dp=1024), global_batch=1024)
    assert z0.states == 16 * memory.model_shape("gpt3-175b").num_params and not z0.fits
    megatron = table[(table.tp == 8) & (table.pp == 16)]  # tp in a node, pp across (Narayanan)
    assert megatron.fits.any()
    best = table.iloc[0]
    assert best.fits and best.tp == 8 and 0.2 < best.mfu < 0.5


def test_dense_fit_keeps_the_stated_headroom():
    from toolkit.planner import experts
    from toolkit.planner.plan import MEMORY_HEADROOM
    assert MEMORY_HEADROOM == experts.MEMORY_HEADROOM  # one margin, dense and MoE alike
    node = cluster("dgx-a100-80gb")
    d = Layout(dp=8, zero=1, recompute="full")
    p = predict("zero-7.5b", node, d, global_batch=8)
    used = p.memory / node.memory_bytes
    assert p.fits == (used <= 1 - MEMORY_HEADROOM)
    # A memory that fills the card but not the margin: fits with no headroom only.
    between = node.memory_bytes * (1 - MEMORY_HEADROOM / 2) / p.memory
    tight = dataclasses.replace(node, memory_bytes=node.memory_bytes / between)
    assert not predict("zero-7.5b", tight, d, global_batch=8).fits
    assert predict("zero-7.5b", tight, d, global_batch=8, headroom=0.0).fits
    with pytest.raises(ValueError, match="headroom must be in"):
        predict("zero-7.5b", node, d, global_batch=8, headroom=1.0)


def test_measured_dp_and_tp_runs_train_the_same_model():
    from toolkit.experiments.planner import run_layout
    cfg = GPTConfig(vocab_size=32, seq_len=16, d_model=32, n_head=4, n_layer=2)
    dp = run_layout(cfg, Layout(dp=2), global_batch=4, steps=2, timeout=60)
    tp = run_layout(cfg, Layout(tp=2, micro_batches=2), global_batch=4, steps=2, timeout=60)
    assert math.isclose(dp["first_loss"], tp["first_loss"], rel_tol=1e-5)
    assert dp["step"] > 0 and dp["dp_comm"] > 0 and tp["dp_comm"] < dp["step"]
    with pytest.raises(ValueError, match="dp × tp with ZeRO 0 only"):
        run_layout(cfg, Layout(pp=2), global_batch=4)


# Figures and the explorer (toolkit.viz.planner, toolkit.widgets.planner), without a browser.

def test_mesh_grid_draws_every_rank_once_coloured_by_node():
    from toolkit.viz.planner import mesh_grid
    d = Layout(dp=2, tp=2, pp=2)
    fig = mesh_grid(d, gpus_per_node=4)
    cells = {a.text for a in fig.layout.annotations if a.text.isdigit()}
    assert cells == {str(r) for r in range(8)} and len(fig.layout.shapes) == 8
    fills = [s.fillcolor for s in fig.layout.shapes]
    assert len(set(fills[:4])) == 1 and fills[0] != fills[4]  # ranks 0-3 on node 0
    assert {"stage 0", "stage 1"} <= {a.text for a in fig.layout.annotations}
    with pytest.raises(ValueError, match="too many cells"):
        mesh_grid(Layout(dp=1024))


def test_time_bars_stack_the_parts_of_the_fastest_feasible_rows():
    from toolkit.viz.planner import memory_time, predicted_measured, time_bars
    table = plan("gpt2-medium", DGX, global_batch=32)
    fig = time_bars(table, top=5, distinct=False)
    stacked = sum(np.asarray(t.x, dtype=float) for t in fig.data)
    assert list(fig.data[0].y) == list(table[table.fits].config.head(5))
    assert stacked == pytest.approx(list(table[table.fits].step.head(5)))
    shapes = time_bars(table, top=5)  # one bar per dp × tp × pp × cp, each its fastest row
    firsts = table[table.fits].groupby(["dp", "tp", "pp", "cp"], sort=False).head(1)
    assert list(shapes.data[0].y) == list(firsts.config.head(5))
    assert len(set(shapes.data[0].y)) == len(shapes.data[0].y)
    assert all("MFU" in a.text for a in fig.layout.annotations)
    pts = memory_time(table, memory_gib=80)
    assert sum(len(t.x) for t in pts.data) == len(table) and pts.layout.shapes[0].x0 == 80
    bars = predicted_measured({"dp4": {"predicted": 0.1, "measured": 0.15}})
    assert bars.layout.annotations[0].text == "×1.50"


def test_planner_view_and_explorer_redraw():
    from toolkit.widgets.planner import planner_explorer, planner_view
    fig, table_html, verdict = planner_view(model="gpt2-small", cluster_name="dgx-a100-80gb",
                                            gpus=8, global_batch=64)
    assert "fastest: <b>dp8·tp1·pp1 z0 m1</b>" in verdict and table_html.count("<tr>") == 9
    _, _, none = planner_view(model="gpt3-175b", cluster_name="dgx-a100-80gb", gpus=8,
                              global_batch=64)
    assert "nothing fits" in none
    _, _, odd = planner_view(model="gpt2-small", cluster_name="dgx-a100-80gb", gpus=12,
                             global_batch=64)
    assert "whole number of 8-GPU nodes" in odd
    ex = planner_explorer("gpt2-small", gpus=8, global_batch=64)
    assert ex.verdict.value == verdict and len(ex.output.outputs) == 1
    ex.model.value = "gpt3-175b"                       # as if picked from the dropdown
    assert "nothing fits" in ex.verdict.value
    ex.gpus.value = 1024
    assert "fit; fastest" in ex.verdict.value and "gpt3-175b on 1024" in ex.figure.layout.title.text
    with pytest.raises(ValueError, match="model must be one of"):
        planner_explorer("gpt-5")
