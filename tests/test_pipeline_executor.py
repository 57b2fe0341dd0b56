"""toolkit.pipeline's executor on real gloo ranks: the same gradients as the unsplit model for
every schedule, a timeline that respects the schedule, counted activation memory, clear errors.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pipeline_reference import reference

from toolkit import comm
from toolkit.models import TinyMLP
from toolkit.pipeline import (
    ScheduleError, assign_layers, bubble_fraction, delay_blocks, make_schedule, run_pipeline,
)

TIMEOUT = 60




def blocks(n: int, width: int = 6) -> list[nn.Module]:
    torch.manual_seed(0)
    return [nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(n)]


CASES = [("naive", p, 1, 1) for p in (2, 4)] + [
    (name, p, m, 1) for name in ("gpipe", "1f1b") for p in (2, 4) for m in (1, 4)] + [
    ("interleaved", p, m, 2) for p in (2, 4) for m in (1, 4)]


@pytest.mark.parametrize("name,p,m,v", CASES)
def test_gradients_equal_the_unsplit_model(name, p, m, v):
    # TinyMLP(depth=3) has 7 layers: 4 stages get 2, 2, 2, 1 (uneven). Interleaved needs an
    # even split: 8 blocks. 10 samples into 4 micro-batches: 3, 3, 2, 2 rows.
    if v == 1:
        layers = list(TinyMLP(d_in=5, d_hidden=6, d_out=3, depth=3, seed=1).layers)
        x, y = torch.randn(10, 5), torch.randn(10, 3)
    else:
        layers = blocks(8)
        x, y = torch.randn(10, 6), torch.randn(10, 6)
    loss, want = reference(layers, x, y)
    run = run_pipeline(layers, x, y, schedule=name, p=p, m=m, v=v, timeout=TIMEOUT)
    assert list(run.grads) == list(want)
    for key, g in want.items():
        torch.testing.assert_close(run.grads[key], g, rtol=1e-5, atol=1e-6, msg=key)
    assert run.loss == pytest.approx(loss, rel=1e-5)
    # One row per op, and each stage ran its ops in the schedule's order without overlap.
    sched = run.schedule
    assert len(run.table) == sum(len(ops) for ops in sched.stages)
    for r, ops in enumerate(sched.stages):
        rows = run.table[run.table.stage == r].sort_values("start")
        assert [(o, mb, c) for o, mb, c in zip(rows.op, rows.mb, rows.chunk)] == \
            [(op.kind, op.mb, op.chunk) for op in ops]
        assert (rows.start.values[1:] >= rows.end.values[:-1] - 1e-9).all()


def test_an_op_starts_after_the_op_whose_output_it_needs():
    layers = blocks(4)
    x, y = torch.randn(8, 6), torch.randn(8, 6)
    run = run_pipeline(layers, x, y, schedule="1f1b", p=4, m=4, timeout=TIMEOUT)
    t = run.table.set_index(["stage", "op", "mb"])
    for mb in range(4):
        for r in range(1, 4):      # one clock for all ranks: causality shows in the times
            assert t.loc[(r, "F", mb), "start"] >= t.loc[(r - 1, "F", mb), "end"]
            assert t.loc[(r - 1, "B", mb), "start"] >= t.loc[(r, "B", mb), "end"]


def test_frozen_layers_get_no_gradient_and_the_rest_match():
    layers = blocks(4)
    for prm in layers[0].parameters():       # stage 0 entirely frozen
        prm.requires_grad_(False)
    x, y = torch.randn(6, 6), torch.randn(6, 6)
    _, want = reference(layers, x, y)
    run = run_pipeline(layers, x, y, schedule="gpipe", p=2, m=3, timeout=TIMEOUT)
    assert "0.0.weight" not in run.grads and list(run.grads) == list(want)
    for key, g in want.items():
        torch.testing.assert_close(run.grads[key], g, rtol=1e-5, atol=1e-6)


def test_activation_memory_gpipe_holds_all_micro_batches_1f1b_at_most_p():
    layers = blocks(4, width=8)
    x, y = torch.randn(16, 8), torch.randn(16, 8)   # 8 micro-batches of 2 rows: equal bytes
    p, m = 4, 8
    runs = {s: run_pipeline(layers, x, y, schedule=s, p=p, m=m, timeout=TIMEOUT)
            for s in ("gpipe", "1f1b")}
    for r in range(p):
        per_mb = set(runs["gpipe"].mb_bytes[r].values())
        assert len(per_mb) == 1 and per_mb.pop() > 0            # every micro-batch saves the same
        one = runs["gpipe"].mb_bytes[r][0, 0]
        assert runs["gpipe"].peak_bytes[r] == m * one
        assert runs["1f1b"].peak_bytes[r] == min(p - r, m) * one
    assert runs["gpipe"].peak_bytes[0] == 2 * runs["1f1b"].peak_bytes[0]


def test_messages_are_one_activation_forward_and_one_gradient_back_per_micro_batch():
    layers = blocks(4, width=8)
    x, y = torch.randn(12, 8), torch.randn(12, 8)
    with comm.recording() as trace:
        run_pipeline(layers, x, y, schedule="1f1b", p=2, m=3, timeout=TIMEOUT)
    totals = trace.totals()
    act = 12 * 8 * 4                                  # the whole batch's activation, float32
    assert totals[0].bytes_sent == act and totals[0].messages_sent == 3   # activations
    assert totals[1].bytes_sent == act and totals[1].messages_sent == 3   # gradients


def test_measured_bubble_holds_what_no_scheduler_can_change():
    """Sleep-based stage work (`Delay`): each op asks for a known sleep, and a busy machine can
    only add idle time, never remove it. So: every op lasts at least its sleep, and the naive
    schedule, whose ranks never work at the same time, leaves at least (p − 1)/p of the ranks'
    time idle. How far more micro-batches shrink the bubble is a timing, measured against
    (p − 1)/(m + p − 1) by benchmarks/pipeline_bubbles.py, not asserted here."""
    f, b = 5e-3, 10e-3                                  # seconds per sample, per block
    layers = delay_blocks(2, width=8, forward=f, backward=b)
    x, y = torch.randn(16, 8), torch.randn(16, 8)
    naive = run_pipeline(layers, x, y, schedule="naive", p=2, timeout=TIMEOUT)
    piped = run_pipeline(layers, x, y, schedule="1f1b", p=2, m=8, timeout=TIMEOUT)
    for run, rows in ((naive, 16), (piped, 2)):         # one block per stage
        ops = run.table
        assert (ops[ops.op == "F"].duration >= rows * f).all()
        assert (ops[ops.op == "B"].duration >= rows * b).all()
    assert bubble_fraction("naive", p=2) == 0.5
    assert naive.bubble >= 0.5 - 1e-9


def test_bad_input_names_the_argument():
    layers = blocks(4)
    x, y = torch.randn(8, 6), torch.randn(8, 6)
    with pytest.raises(ValueError, match=r"m must be an int >= 1"):
        run_pipeline(layers, x, y, schedule="gpipe", p=2, m=0)
    with pytest.raises(ValueError, match=r"p \(stages\) = 5 is more than the 4 layers"):
        run_pipeline(layers, x, y, schedule="gpipe", p=5, m=2)
    with pytest.raises(ValueError, match=r"v \(chunks per rank\) = 3 must divide the layers per"):
        run_pipeline(blocks(8), x, y, schedule="interleaved", p=2, m=2, v=3)
    with pytest.raises(ValueError, match=r"m \(micro-batches\) = 9 is more than the batch"):
        run_pipeline(layers, x, y, schedule="gpipe", p=2, m=9)
    with pytest.raises(ValueError, match="pass p"):
        run_pipeline(layers, x, y, schedule="gpipe")
    bad = make_schedule("gpipe", p=2, m=2)
    with pytest.raises(ValueError, match="disagrees with the schedule"):
        run_pipeline(layers, x, y, schedule=bad, m=4)
    swapped = [["F0", "F1", "B1", "B0"], ["F0", "B0", "F1", "B1"]]
    from toolkit.pipeline import as_schedule
    with pytest.raises(ScheduleError, match="mismatch|receives"):   # before any rank starts
        run_pipeline(layers, x, y, schedule=as_schedule(swapped), timeout=5)


def test_delay_sleeps_per_sample_and_passes_values_and_gradients_through(monkeypatch):
    import time

    from toolkit.pipeline import Delay, no_delay
    slept = []   # what each sleep was asked for (seconds), not how long it took
    monkeypatch.setattr(time, "sleep", slept.append)
    layer = Delay(forward=0.05, backward=0.1)
    x = torch.randn(2, 3, requires_grad=True)
    out = layer(x)
    assert slept == [pytest.approx(2 * 0.05)]                   # 2 samples forward
    out.backward(torch.full_like(out, 3.0))
    assert slept == [pytest.approx(2 * 0.05), pytest.approx(2 * 0.1)]   # and backward
    assert torch.equal(out, x) and torch.equal(x.grad, torch.full_like(x, 3.0))
    slept.clear()
    with no_delay():
        Delay(forward=1.0)(x)                                  # would sleep 2 s
    assert slept == []
    with pytest.raises(ValueError, match="seconds >= 0"):
        Delay(forward=-1)


def test_a_whole_model_is_refused_with_a_hint():
    model = TinyMLP(depth=1)
    with pytest.raises(ValueError, match=r"e\.g\. model\.layers"):
        run_pipeline(model, torch.randn(4, 8), torch.randn(4, 4), schedule="gpipe", p=2)


def test_assign_layers_uneven_and_interleaved():
    assert assign_layers(7, p=4) == [[range(0, 2)], [range(2, 4)], [range(4, 6)], [range(6, 7)]]
    # Megatron's interleaving: chunk c of rank r is virtual stage c*p + r.
    assert assign_layers(8, p=2, v=2) == [[range(0, 2), range(4, 6)], [range(2, 4), range(6, 8)]]
    with pytest.raises(ValueError, match="do not split into p = 3 equal stages"):
        assign_layers(8, p=3, v=2)
