"""Chimera (Li & Hoefler, SC 2021: two pipelines in opposite directions) and TeraPipe (Li et al.,
ICML 2021: token slices of one sequence) as schedules: their data, the validator's view of their
extra rules, the simulator against the papers' counts, TeraPipe's slicing search, and both run
on 2-4 gloo ranks against the unsplit model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pipeline_reference import reference, run_matches_reference

from toolkit.cost.bubble import terapipe_time
from toolkit.cost.token_slices import best_slicing, slice_times
from toolkit.models import TinyMLP
from toolkit.pipeline import (
    as_schedule, assign_layers, bubble_fraction, chimera, gpipe, held_at_peak, in_flight,
    make_schedule, one_f_one_b, peak_activations, problems, run_pipeline, simulate, terapipe,
)
from toolkit.pipeline.token_layers import SlicedAttention

TIMEOUT = 60


def kinds(found) -> list[str]:
    return [p.kind for p in found]


# --- Chimera on paper ---------------------------------------------------------------------------

def test_chimera_holds_two_pipelines_on_every_rank():
    s = chimera(4, 4)
    assert (s.layout, s.v, s.depth, s.share, s.name) == ("bidirectional", 2, 4, 1.0, "chimera")
    assert " ".join(map(str, s[0])) == "F0 F1 F2.1 B2.1 F3.1 B3.1 B0 B1"
    # Micro-batches 0, 1 go down (chunk 0: stage r on rank r), 2, 3 up (stage p-1-r on rank r).
    assert [s.pipe(mb) for mb in range(4)] == [0, 0, 1, 1]
    assert s.virtual_stage(0, 1) == 3 and s.place(3, 1) == (0, 1) and s.place(3, 0) == (3, 0)
    assert assign_layers(8, p=4, layout="bidirectional")[0] == [range(0, 2), range(6, 8)]
    assert make_schedule("chimera", p=4, m=4) == s
    for bad in ((3, 4), (4, 3), (4, 6)):
        with pytest.raises(ValueError, match="even|multiple"):
            chimera(*bad)


@pytest.mark.parametrize("p", [2, 4, 6, 8])
def test_chimera_bubble_and_memory_equal_the_papers_count_for_one_unit(p):
    """Section 3.2, Table 2: forward and backward of equal length, m = p: idle fraction
    (p−2)/(2m+p−2); activations from p/2+1 (end ranks) to p (middle ranks)."""
    s = chimera(p, p)
    assert problems(s, p=p, m=p) == []
    t = simulate(s, forward=1, backward=1)
    assert t.bubble == pytest.approx(bubble_fraction("chimera", p=p, m=p), abs=1e-12)
    assert t.makespan == 2 * p + p - 2
    held = in_flight(s)
    assert min(held) == held[0] == held[-1] == p // 2 + 1 and max(held) == p
    assert held == [peak_activations("chimera", p=p, m=p, stage=r) for r in range(p)]
    # 1F1B, same p and m: 2(p-1) idle slots, p on stage 0 and 1 on the last.
    base = simulate(one_f_one_b(p, p), forward=1, backward=1)
    assert base.makespan - 2 * p == 2 * (p - 1)
    assert in_flight(one_f_one_b(p, p))[-1] == 1


def test_chimera_where_its_count_does_not_hold():
    # A backward twice the forward: the two pipelines' slots no longer interlock.
    s = chimera(4, 4)
    assert simulate(s, forward=1, backward=2).makespan > 4 * 3 + (4 - 2) * 3 / 2
    # Concatenated units (m = 2p) each idle their own p - 2 slots, unlike (p-2)/(2m+p-2).
    t = simulate(chimera(4, 8), forward=1, backward=1)
    assert t.makespan == 2 * (2 * 4 + 4 - 2)
    assert t.bubble > bubble_fraction("chimera", p=4, m=8)
    assert in_flight(chimera(4, 8)) == in_flight(chimera(4, 4))     # memory of one unit
    with pytest.raises(ValueError, match="m >= p"):
        bubble_fraction("chimera", p=4, m=2)


def test_validator_knows_a_micro_batch_runs_in_one_pipeline():
    rows = [[str(op) for op in ops] for ops in chimera(2, 2).stages]
    rows[1] = ["F0.1" if op == "F0" else op for op in rows[1]]     # mb 0 half down, half up
    found = problems(rows, p=2, m=2, layout="bidirectional")
    assert "shape" in kinds(found)
    assert any("puts micro-batch 0 on chunk 1, but its other ops run it in the down pipeline"
               in str(f) for f in found)
    # Read as a loop layout, Chimera's lists miss every chunk-1 op of the down micro-batches.
    plain = [[str(op) for op in ops] for ops in chimera(2, 2).stages]
    assert "missing" in kinds(problems(plain, p=2, m=2))
    assert problems(plain, p=2, m=2, layout="bidirectional") == []


# --- TeraPipe on paper --------------------------------------------------------------------------

def test_terapipe_runs_slices_in_order_and_backwards_reversed():
    s = terapipe(3, 4)
    assert s.sequence and " ".join(map(str, s[0])) == "F0 F1 F2 F3 B3 B2 B1 B0"
    assert problems(s, p=3, m=4) == [] and in_flight(s) == [4, 4, 4]
    wrong = as_schedule(gpipe(2, 3), sequence=True)            # backwards in slice order
    found = problems(wrong)
    assert set(kinds(found)) == {"order"}
    assert "B0 (step 3) comes before B1 (step 4): a token slice's backward needs the " \
           "gradients that the later slices' backwards send" in found[0].message
    swapped = [["F1", "F0", "B1", "B0"]] * 2
    assert "F1 (step 0) comes before F0" in str(problems(swapped, sequence=True)[0])
    assert problems(swapped) == []                 # micro-batches of samples: any order


def test_terapipe_time_is_the_papers_formula_and_the_simulator_agrees():
    lengths = [12, 8, 6, 6]
    times = slice_times(lengths, per_token=1.0, per_pair=0.05, per_slice=2.0)
    # t(l, c) = s0 + a l + b (l c + l (l + 1) / 2): the second slice, 8 tokens after 12.
    assert times[1] == pytest.approx(2 + 8 + 0.05 * (8 * 12 + 36))
    for p in (1, 2, 4):
        want = sum(times) + (p - 1) * max(times)
        assert terapipe_time(times, p=p) == pytest.approx(want)
        sim = simulate(terapipe(p, len(times)), cost=lambda r, op: times[op.mb] / 3 * (
            1 if op.kind == "F" else 2))            # forward a third, backward two thirds
        assert sim.makespan == pytest.approx(want)
    # Equal slices, equal times: GPipe's bubble.
    t = simulate(terapipe(4, 8), forward=1, backward=2)
    assert t.bubble == pytest.approx(bubble_fraction("terapipe", p=4, m=8))


def test_best_slicing_beats_every_equal_cut_and_covers_the_sequence():
    rates = dict(per_token=1.0, per_pair=0.05, per_slice=8.0)
    best = best_slicing(64, p=4, step=4, **rates)
    assert sum(best) == 64 and all(n % 4 == 0 for n in best)
    cost = terapipe_time(slice_times(best, **rates), p=4)
    for n in (1, 2, 4, 8, 16):
        assert cost <= terapipe_time(slice_times([64 // n] * n, **rates), p=4) + 1e-9
    assert best[-1] < best[0]                      # later slices attend further: shorter
    # Attention free and no cost per slice: the finest cut wins.
    assert best_slicing(16, p=4, per_token=1.0, per_pair=0.0, step=4) == [4, 4, 4, 4]
    with pytest.raises(ValueError, match="per_pair"):
        slice_times([4], per_token=1.0, per_pair=-1.0)


# --- real ranks ---------------------------------------------------------------------------------



@pytest.mark.parametrize("p,m", [(2, 2), (4, 4), (4, 8), (2, 6)])
def test_chimera_on_real_ranks_gives_the_unsplit_gradients(p, m):
    layers = list(TinyMLP(d_in=5, d_hidden=6, d_out=3, depth=3, seed=4).layers)   # 7 layers
    x, y = torch.randn(11, 5), torch.randn(11, 3)
    _, trace = run_matches_reference(layers, x, y, schedule="chimera", p=p, m=m, timeout=TIMEOUT)
    # After the step, rank r and rank p-1-r swapped one flat gradient each: the replica's.
    sizes = [sum(q.numel() for i in chunks[0] for q in layers[i].parameters())
             for chunks in assign_layers(len(layers), p=p)]
    last = {}
    for e in trace.events:
        if e.op in ("isend", "send"):
            last[e.rank] = e
    for r in range(p):
        assert last[r].peer == p - 1 - r and last[r].nbytes == 4 * sizes[p - 1 - r]


def test_terapipe_with_causal_attention_on_real_ranks():
    d = 8
    layers = []
    for i in range(4):
        layers += [SlicedAttention(d, heads=2, seed=i), nn.Linear(d, d)]
    torch.manual_seed(5)
    x, y = torch.randn(13, d), torch.randn(13, d)        # 13 tokens into 4 slices: 4, 3, 3, 3
    whole = layers[0](x)
    layers[0].start_sequence()
    sliced = torch.cat([layers[0](part) for part in torch.tensor_split(x, 4)])
    torch.testing.assert_close(sliced, whole)            # slice by slice = all at once
    loss, want = reference(layers, x, y)
    for p, n in ((2, 4), (4, 5)):
        run = run_pipeline(layers, x, y, schedule="terapipe", p=p, m=n, timeout=TIMEOUT)
        for key, g in want.items():
            torch.testing.assert_close(run.grads[key], g, rtol=1e-4, atol=1e-6, msg=key)
        assert run.loss == pytest.approx(loss, rel=1e-5)
        assert held_at_peak(run.schedule) == [(n, 0)] * p


def test_attention_slices_in_the_wrong_order_fail_loudly():
    layers = [SlicedAttention(4, heads=1, seed=0), nn.Linear(4, 4)]
    x, y = torch.randn(6, 4), torch.randn(6, 4)
    # GPipe's order is not a sequence schedule: the graph is freed after slice 0's backward,
    # which slice 1's backward still needs.
    with pytest.raises(Exception, match="backward through the graph a second time"):
        run_pipeline(layers, x, y, schedule=gpipe(2, 3), timeout=TIMEOUT)
