"""toolkit.planner.calibrated and its measurement: the ops of a step against toolkit.flops and
the models' own parameter counts, a prediction hand-checked part by part, Kendall's τ, every
op's bench on one process, and `calibrate` on 2 gloo ranks."""

from __future__ import annotations

import math

import pytest
import torch

from toolkit.cost import AlphaBeta, predict as collective_time
from toolkit.flops import step_flops
from toolkit.models import GPTConfig, gpt_param_count
from toolkit.planner import Calibration, Layout, kendall_tau, predict_calibrated
from toolkit.planner.calibrated import KINDS, Op, dense_ops, local_params, op_work, step_ops

CFG = GPTConfig(vocab_size=32, seq_len=16, d_model=32, n_head=4, n_layer=2)


def _matmul_flops(ops: dict[Op, int]) -> float:
    return sum(n * op_work(op) for op, n in ops.items() if op.kind in ("linear", "attention"))


def test_step_ops_do_the_flops_of_toolkit_flops():
    # dp: each rank runs B/dp sequences of the whole model; 6N + 12·L·h·s per token in all.
    dp4 = step_ops(CFG, Layout(dp=4, micro_batches=2), global_batch=8)
    assert 4 * _matmul_flops(dp4) == step_flops(CFG, 8)["model"]
    # tp: every weight matrix and the heads split, the lm_head (2·h·V per token) whole on each.
    tp2 = step_ops(CFG, Layout(dp=2, tp=2), global_batch=8)
    replica = step_flops(CFG, 4)["model"]  # one dp replica's 4 sequences
    head = 6 * 4 * CFG.seq_len * CFG.d_model * CFG.vocab_size
    assert _matmul_flops(tp2) == (replica - head) / 2 + head
    kinds = {op.kind for op in tp2}
    assert {"bias", "copy", "flatten"} <= kinds and "accumulate" not in kinds
    assert tp2[Op("copy", (64, 32))] == 4 * CFG.n_layer  # f and g, forward and backward
    assert "bias" not in {op.kind for op in dp4}
    assert dp4[Op("accumulate", (local_params(CFG, 1),))] == 1  # micro-batch 2 adds into .grad
    assert set(dense_ops(CFG, 16)) <= set(step_ops(CFG, Layout(), global_batch=1))
    assert not {"optimizer", "accumulate"} & {op.kind for op in dense_ops(CFG, 16)}


def test_local_params_shard_the_matrices_and_keep_the_rest():
    assert local_params(CFG, 1) == gpt_param_count(CFG)
    h, f, L = CFG.d_model, CFG.ff_dim, CFG.n_layer
    whole = CFG.vocab_size * h + CFG.seq_len * h + 2 * h + L * (2 * h + 4 * h)  # row biases, LNs
    split = L * (4 * h * h + 2 * h * f + 3 * h + f)  # weight matrices, column-parallel biases
    assert local_params(CFG, 2) == whole + split // 2


def test_step_ops_refuse_what_the_runs_do_not_cover():
    with pytest.raises(ValueError, match="dp × tp layouts with ZeRO 0"):
        step_ops(CFG, Layout(dp=2, pp=2), global_batch=8)
    with pytest.raises(ValueError, match="split into dp × m"):
        step_ops(CFG, Layout(dp=4, micro_batches=4), global_batch=8)
    with pytest.raises(ValueError, match="must divide n_head"):
        step_ops(CFG, Layout(tp=8), global_batch=8)
    with pytest.raises(ValueError, match="kind must be one of"):
        Op("conv", (1,))
    with pytest.raises(ValueError, match="whole sequences"):
        dense_ops(CFG, 10)


LINK = AlphaBeta(alpha=1e-4, beta=1e-9)


def _calibration(**kw) -> Calibration:
    ops = {op for d in (Layout(dp=2), Layout(tp=2, micro_batches=2))
           for op in step_ops(CFG, d, global_batch=4)}
    rates = {op: 1e9 if op.kind in ("linear", "attention") else 2e9 for op in ops}
    return Calibration(rates=rates, links={2: LINK}, glue=1e-3, **kw)


def test_a_prediction_is_its_parts_each_hand_checked():
    cal = _calibration()
    d = Layout(tp=2, micro_batches=2)
    p = predict_calibrated(CFG, d, cal, global_batch=4)
    ops = step_ops(CFG, d, global_batch=4)
    assert p.parts["linear"] == pytest.approx(sum(n * op_work(o) for o, n in ops.items()
                                                  if o.kind == "linear") / 1e9)
    assert p.parts["glue"] == 2 * 1e-3
    b_s_h = 2 * CFG.seq_len * CFG.d_model * 4  # b = 2 sequences per micro-batch, fp32
    ar = 2 * LINK.alpha + b_s_h * LINK.beta   # a ring of 2: 2 rounds, n bytes each way
    assert p.parts["tp_comm"] == pytest.approx(4 * CFG.n_layer * 2 * ar)
    assert p.parts["dp_comm"] == 0 and p.step == pytest.approx(sum(p.parts.values()))
    assert p.compute == pytest.approx(p.step - p.parts["tp_comm"])
    assert p.matmul == pytest.approx(p.parts["linear"] + p.parts["attention"])
    dp = predict_calibrated(CFG, Layout(dp=2), cal, global_batch=4)
    grads = 4 * local_params(CFG, 1)
    assert dp.parts["dp_comm"] == pytest.approx(
        float(collective_time("all_reduce", "ring", grads, 2, LINK)))


def test_calibration_falls_back_to_the_nearest_size_and_names_what_is_missing():
    cal = _calibration()
    near = Op("linear", (64, 32, 128, 1))  # not measured: the closest work of its kind
    assert cal.rate(near) == 1e9
    with pytest.raises(ValueError, match="no all-reduce over 4 ranks"):
        predict_calibrated(CFG, Layout(tp=4), cal, global_batch=4)
    with pytest.raises(ValueError, match="no 'bias' rate"):
        Calibration(rates={Op("linear", (1, 1, 1, 0)): 1.0}, links={}).rate(Op("bias", (1, 1)))
    with pytest.raises(ValueError, match="glue must be >= 0"):
        Calibration(rates={}, links={}, glue=-1.0)
    with pytest.raises(ValueError, match="rate of linear"):
        Calibration(rates={Op("linear", (1, 1, 1, 0)): 0.0}, links={})


def test_kendall_tau_counts_pairs_in_the_same_order():
    assert kendall_tau([1, 2, 3], [10, 20, 30]) == 1
    assert kendall_tau([1, 2, 3], [3, 2, 1]) == -1
    assert kendall_tau([1, 2, 3], [1, 3, 2]) == pytest.approx(1 / 3)
    assert kendall_tau([1, 1, 2], [1, 2, 3]) == pytest.approx(2 / 3)  # a tie counts as neither
    with pytest.raises(ValueError, match="same length"):
        kendall_tau([1, 2], [1])


def test_every_op_bench_runs_forward_and_backward_in_and_out_of_cache():
    from toolkit.experiments.planner_ops import OperandPool, op_bench, stand_ins
    from toolkit.models import TinyGPT
    weights = list(TinyGPT(CFG).parameters())
    params = stand_ins(weights)
    ops = {**step_ops(CFG, Layout(micro_batches=2), global_batch=4), Op("bias", (32, 32)): 1,
           Op("copy", (32, 32)): 1, Op("flatten", (local_params(CFG, 1),)): 1}
    pool = OperandPool(1 << 20)
    assert {op.kind for op in ops} == set(KINDS)
    for op in ops:
        for source in (None, pool):
            out = op_bench(op, CFG, params=params, pool=source)()
            if op.kind == "copy":
                assert out.shape == (32, 32) and out.is_contiguous()
    small = OperandPool(64)  # 16 numbers: four cuts of 4, then round again
    cuts = [small.cut((2, 2)) for _ in range(5)]
    assert len({c.data_ptr() for c in cuts[:4]}) == 4 and cuts[4].data_ptr() == cuts[0].data_ptr()
    assert all(c.requires_grad and c.is_leaf for c in cuts)
    with pytest.raises(ValueError, match="17 elements asked of a pool of 16"):
        small.cut((17,))
    grads = op_bench(Op("linear", (8, 4, 6, 1)), CFG)()
    assert [g.shape for g in grads] == [(8, 4), (6, 4), (6,)]
    with pytest.raises(ValueError, match="needs the rank's parameters"):
        op_bench(Op("optimizer", (7,)), CFG, params=params)
    with pytest.raises(ValueError, match="needs a .grad"):
        op_bench(Op("optimizer", (local_params(CFG, 1),)), CFG, params=weights)
    assert all(torch.equal(p, torch.full_like(p, 1e-3)) for p in params)  # lr 0: weights stay
    assert torch.equal(weights[0], TinyGPT(CFG).tok_emb.weight)  # the model's own, untouched


@pytest.mark.multirank
def test_calibrate_measures_every_op_and_link_on_ranks():
    from toolkit.experiments.planner import calibrate
    layouts = [Layout(dp=2), Layout(tp=2, micro_batches=2)]
    cal, runs = calibrate(CFG, layouts, global_batch=4, rounds=1, steps=1, trials=1,
                          cold_bytes=1 << 20, timeout=120)
    needed = {op for d in layouts for op in step_ops(CFG, d, global_batch=4)}
    assert needed == set(cal.rates) and all(r > 0 for r in cal.rates.values())
    assert set(cal.links) == {2} and cal.glue >= 0
    assert math.isclose(runs.first_loss.max(), runs.first_loss.min(), rel_tol=1e-5)
    assert list(runs.index) == [d.label() for d in layouts]
    assert (runs.core > runs.comm_core).all() and (runs.comm_core > 0).all()
    assert (runs.contention > 0).all()
    for d in layouts:
        assert predict_calibrated(CFG, d, cal, global_batch=4).step > 0
