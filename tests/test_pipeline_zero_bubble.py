"""ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): the backward split into B
(input gradient) and W (weight gradient). The schedule as data, what the validator says about
W, the simulator against the paper's formula (and where the formula stops holding), what each
stage holds, and the executor on 2-4 gloo ranks against the unsplit model."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from pipeline_reference import reference

from toolkit import comm
from toolkit.cost.bubble import bubble_time, step_time
from toolkit.models import TinyMLP
from toolkit.pipeline import (
    Delay, Op, as_schedule, bubble_fraction, delay_blocks, held_at_peak, in_flight,
    make_schedule, one_f_one_b, peak_activations, peak_held, problems, run_pipeline, simulate,
    stage_times, zb_h1,
)

TIMEOUT = 60


def kinds(found) -> list[str]:
    return [p.kind for p in found]


def text(schedule, stage: int) -> str:
    return " ".join(map(str, schedule[stage]))


# --- the schedule as data -----------------------------------------------------------------------

def test_zb_h1_order_delays_w_by_the_stage_index():
    s = zb_h1(4, 8)
    assert s.split and s.name == "zb-h1" and make_schedule("ZB_H1", p=4, m=8) == s
    assert text(s, 0) == ("F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 "
                          "B7 W7")
    assert text(s, 3) == ("F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 "
                          "W7")
    # Without its W ops, every stage runs exactly 1F1B's order.
    for r in range(4):
        assert [op for op in s[r] if op.kind != "W"] == list(one_f_one_b(4, 8)[r])


@pytest.mark.parametrize("p,m", [(1, 1), (1, 3), (2, 1), (2, 5), (3, 2), (4, 4), (4, 7),
                                 (5, 16), (8, 8)])
def test_zb_h1_is_valid_and_holds_at_most_p_on_every_stage(p, m):
    s = zb_h1(p, m)
    assert problems(s, p=p, m=m, max_in_flight=p) == []
    assert in_flight(s) == [min(p, m)] * p
    assert sum(op.kind == "W" for ops in s.stages for op in ops) == p * m


def test_as_schedule_reads_w_ops_and_round_trips():
    s = zb_h1(3, 4)
    assert as_schedule([[str(op) for op in ops] for ops in s.stages]).stages == s.stages
    assert as_schedule([[("W", 2)]]).stages == ((Op("W", 2),),)
    with pytest.raises(ValueError, match="'B<micro-batch>' or 'W<micro-batch>'"):
        as_schedule([["X1"]])


# --- the validator knows W ----------------------------------------------------------------------

def test_a_w_before_its_b_is_an_order_problem():
    rows = [[str(op) for op in ops] for ops in zb_h1(2, 2).stages]
    rows[1] = ["F0", "W0", "B0", "F1", "B1", "W1"]
    found = problems(rows)
    assert kinds(found) == ["order"] and found[0].stage == 1
    assert "W0 (step 1) comes before B0 (step 2): the weight gradient needs the output " \
           "gradient its B received" in found[0].message


def test_a_forgotten_w_is_missing_and_a_stray_op_is_named():
    rows = [[str(op) for op in ops] for ops in zb_h1(2, 3).stages]
    rows[0].remove("W2")
    found = problems(rows, p=2, m=3)
    assert kinds(found) == ["missing"]
    assert found[0].message == "stage 0: no weight gradient (W) of micro-batch 2"
    rows = [[str(op) for op in ops] for ops in zb_h1(2, 2).stages]
    rows[1].append("W5")
    found = problems(rows, p=2, m=2)
    assert kinds(found) == ["shape"]
    assert found[0].message == "stage 1: op W5 is not an F, B or W of micro-batch 0 … 1"


def test_deadlock_mismatch_and_in_flight_still_named_with_w_ops():
    # Stage 0 wants B0 before sending F1; stage 1 wants F1 before sending B0's gradient.
    found = problems([["F0", "B0", "W0", "F1", "B1", "W1"], ["F0", "F1", "B0", "W0", "B1", "W1"]])
    assert kinds(found) == ["deadlock"]
    assert "stage 0 is stuck at B0 (step 1)" in found[0].message
    found = problems([["F0", "F1", "B0", "B1", "W0", "W1"], ["F1", "F0", "B0", "B1", "W0", "W1"]])
    assert "mismatch" in kinds(found)
    # GPipe with its W ops at the very end holds all m until then.
    late = [[f"F{i}" for i in range(4)] + [f"B{i}" for i in range(4)] + [f"W{i}" for i in range(4)]
            ] * 2
    found = problems(late, max_in_flight=2)
    assert set(kinds(found)) == {"in_flight"}
    assert "not yet through their W" in found[0].message


# --- the simulator against the paper's formula --------------------------------------------------

def test_simulated_zb_h1_equals_the_formula_when_w_is_not_the_longest_op():
    """Qi et al., Table 2: idle (p−1)(t_F + t_B − t_W) per stage. Exact for m ≥ p whenever
    t_W ≤ min(t_F, t_B) (transformer layers: t_W ≤ t_F ≤ t_B, the paper's Table 1)."""
    times = [0.25, 0.5, 1.0, 2.0]
    for (p, m), (f, b, w) in itertools.product([(2, 2), (2, 5), (4, 4), (4, 8), (6, 13)],
                                               itertools.product(times, times, times)):
        t = simulate(zb_h1(p, m), forward=f, backward=b, weight=w)
        want = step_time("zb-h1", p=p, m=m, forward=f, backward=b, weight=w)
        if w <= min(f, b):
            assert t.makespan == pytest.approx(want, abs=1e-9), (p, m, f, b, w)
        else:            # W longer than F or B: the delayed W overflow the drain
            assert t.makespan > want + 1e-9, (p, m, f, b, w)


def test_equal_times_give_a_third_of_1f1b_bubble_time():
    p, m = 4, 8
    zb = simulate(zb_h1(p, m), forward=1, backward=1, weight=1)
    base = simulate(one_f_one_b(p, m), forward=1, backward=1, weight=1)
    assert base.makespan - 3 * m == 3 * (zb.makespan - 3 * m) == 3 * (p - 1)
    assert zb.bubble == pytest.approx(3 / 27)
    assert bubble_fraction("zb-h1", p=p, m=m, forward=1, backward=1, weight=1) == \
        pytest.approx(3 / 27)
    assert bubble_time("1f1b", p=p, m=m, forward=1, backward=1, weight=1) == 9
    # No weight time at all: ZB-H1 is 1F1B again.
    assert simulate(zb_h1(p, m), forward=1, backward=2, weight=0).makespan == \
        simulate(one_f_one_b(p, m), forward=1, backward=2).makespan
    with pytest.raises(ValueError, match="pass forward=, backward="):
        bubble_fraction("zb-h1", p=4, m=8)


def test_messages_that_cost_time_leave_zb_h1_above_its_formula():
    t = simulate(zb_h1(4, 8), forward=1, backward=1, weight=1, comm=0.25)
    assert t.makespan > step_time("zb-h1", p=4, m=8, forward=1, backward=1, weight=1)


def test_what_each_stage_holds():
    s = zb_h1(4, 8)
    assert held_at_peak(s) == [(4, 0), (3, 1), (2, 2), (1, 3)]
    assert peak_held(s, weight_share=0.5) == [4, 3.5, 3, 2.5]
    assert [peak_activations("zb-h1", p=4, m=8, stage=r, weight_share=0.5)
            for r in range(4)] == [4, 3.5, 3, 2.5]
    assert held_at_peak(one_f_one_b(4, 8)) == [(4, 0), (3, 0), (2, 0), (1, 0)]
    with pytest.raises(ValueError, match="weight_share"):
        peak_held(s, weight_share=-1)


# --- real ranks ---------------------------------------------------------------------------------



@pytest.mark.parametrize("p,m", [(2, 4), (4, 4), (3, 5), (4, 2)])
def test_zb_h1_on_real_ranks_gives_the_unsplit_gradients(p, m):
    # 7 layers over 4 stages: 2, 2, 2, 1 (uneven); 10 samples over 4 micro-batches: 3, 3, 2, 2.
    layers = list(TinyMLP(d_in=5, d_hidden=6, d_out=3, depth=3, seed=2).layers)
    x, y = torch.randn(10, 5), torch.randn(10, 3)
    loss, want = reference(layers, x, y)
    run = run_pipeline(layers, x, y, schedule="zb-h1", p=p, m=m, timeout=TIMEOUT)
    assert list(run.grads) == list(want)
    for key, g in want.items():
        torch.testing.assert_close(run.grads[key], g, rtol=1e-5, atol=1e-6, msg=key)
    assert run.loss == pytest.approx(loss, rel=1e-5)
    for r, ops in enumerate(run.schedule.stages):      # each stage ran its list, W ops too
        rows = run.table[run.table.stage == r].sort_values("start")
        assert list(zip(rows.op, rows.mb)) == [(op.kind, op.mb) for op in ops]


def test_frozen_layers_and_in_place_activations_with_a_split_backward():
    torch.manual_seed(3)
    layers = [nn.Sequential(nn.Linear(6, 6), nn.ReLU(inplace=True)) for _ in range(4)]
    for prm in layers[0].parameters():
        prm.requires_grad_(False)
    layers[2][0].bias.requires_grad_(False)                 # half a layer frozen
    x, y = torch.randn(6, 6), torch.randn(6, 6)
    _, want = reference(layers, x, y)
    run = run_pipeline(layers, x, y, schedule=zb_h1(2, 3), timeout=TIMEOUT)
    assert list(run.grads) == list(want) and "2.0.bias" not in run.grads
    for key, g in want.items():
        torch.testing.assert_close(run.grads[key], g, rtol=1e-5, atol=1e-6, msg=key)


def test_memory_counted_w_keeps_the_graph_and_the_output_gradients():
    # One block per stage, 2 rows per micro-batch: a forward saves A bytes, B keeps G bytes of
    # output gradients (the Linear's and the Delay's outputs) until W.
    p, m, width = 4, 8, 8
    layers = delay_blocks(p, width=width, forward=0, backward=0, weight=1e-6)
    x, y = torch.randn(2 * m, width), torch.randn(2 * m, width)
    zb = run_pipeline(layers, x, y, schedule="zb-h1", p=p, m=m, timeout=TIMEOUT)
    one = run_pipeline(layers, x, y, schedule="1f1b", p=p, m=m, timeout=TIMEOUT)
    grad = 2 * 2 * width * 4                 # two outputs of (2, width) float32
    for r in range(p):
        a = zb.mb_bytes[r][0, 0]
        assert set(zb.grad_bytes[r].values()) == {grad}
        assert one.peak_bytes[r] == (p - r) * a == (p - r) * one.mb_bytes[r][0, 0]
        # p micro-batches between F and W, r of them past B; B itself adds one more G.
        assert zb.peak_bytes[r] == p * a + (r + 1) * grad


def test_w_sends_nothing_so_messages_equal_1f1b():
    layers = delay_blocks(4, width=8, forward=0, backward=0, weight=1e-6)
    x, y = torch.randn(12, 8), torch.randn(12, 8)
    totals = {}
    for name in ("1f1b", "zb-h1"):
        with comm.recording() as trace:
            run_pipeline(layers, x, y, schedule=name, p=2, m=3, timeout=TIMEOUT)
        totals[name] = {r: (t.bytes_sent, t.messages_sent) for r, t in trace.totals().items()}
    assert totals["zb-h1"] == totals["1f1b"] == {0: (12 * 8 * 4, 3), 1: (12 * 8 * 4, 3)}


def test_split_delay_sleeps_b_and_w_separately():
    """Sleep-based stages: each op lasts at least what it asks to sleep, and a busy machine
    cannot shorten a sleep; nothing here depends on how much longer it took."""
    f, b, w = 2e-3, 3e-3, 4e-3                            # seconds per sample, per block
    layers = delay_blocks(2, width=8, forward=f, backward=b, weight=w)
    x, y = torch.randn(8, 8), torch.randn(8, 8)
    for name, parts in (("zb-h1", {"F": f, "B": b, "W": w}), ("1f1b", {"F": f, "B": b + w})):
        run = run_pipeline(layers, x, y, schedule=name, p=2, m=4, timeout=TIMEOUT)
        assert set(run.table.op) == set(parts)
        for kind, seconds in parts.items():
            assert (run.table[run.table.op == kind].duration >= 2 * seconds).all(), (name, kind)
        forward, backward, weight = stage_times(run.table, weight=True)
        assert forward >= 2 * f and backward >= 2 * parts["B"]
        assert weight == 0.0 if name == "1f1b" else weight >= 2 * w


def test_delay_weight_time_is_exact_identity_with_a_real_gradient(monkeypatch):
    import time

    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)
    layer = Delay(forward=0.01, backward=0.02, weight=0.03)
    x = torch.randn(3, 4, requires_grad=True)
    out = layer(x)
    assert torch.equal(out, x) and slept == [pytest.approx(0.03)]
    g = torch.randn(3, 4)
    gx, = torch.autograd.grad(out, x, g, retain_graph=True)    # B: the input gradient only
    assert torch.equal(gx, g) and slept[1:] == [pytest.approx(0.06)]
    out.backward(g)                                           # the whole backward: both
    assert sorted(slept[2:]) == [pytest.approx(0.06), pytest.approx(0.09)]
    torch.testing.assert_close(layer.clock.grad, (g * x).sum())
    assert Delay(weight=0).clock is None and not list(Delay().parameters())
