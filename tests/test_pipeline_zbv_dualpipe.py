"""ZB-V (Qi et al., arXiv:2401.10241) and DualPipe (DeepSeek-V3 report, section 3.2.1, Table 2)
as data: the V layout, backwards split on some micro-batches only, the validator's verdicts, the
simulator against the papers' counts over a grid of p and m, and both on 2-4 gloo ranks against
the single-process model."""

from __future__ import annotations

import itertools

import pytest
import torch

from pipeline_reference import run_matches_reference

from toolkit.cost.bubble import bubble_time, step_time
from toolkit.models import TinyMLP
from toolkit.pipeline import (
    as_schedule, assign_layers, bubble_fraction, dualpipe, idle_within, in_flight, make_schedule,
    one_f_one_b, peak_activations, peak_held, problems, sent_messages, simulate,
    zb_v,
)

TIMEOUT = 60


def kinds(found) -> list[str]:
    return [f.kind for f in found]


# --- the V layout -------------------------------------------------------------------------------

def test_v_layout_goes_down_the_ranks_and_back_up():
    s = zb_v(4, 8)
    assert (s.layout, s.v, s.depth, s.share, s.split, s.name) == ("v", 2, 8, 0.5, True, "zb-v")
    assert [s.virtual_stage(r, c) for c in (0, 1) for r in range(4)] == [0, 1, 2, 3, 7, 6, 5, 4]
    assert [s.place(k) for k in range(8)] == [(0, 0), (1, 0), (2, 0), (3, 0),
                                              (3, 1), (2, 1), (1, 1), (0, 1)]
    assert assign_layers(9, p=2, layout="v") == [[range(0, 3), range(7, 9)],
                                                 [range(3, 5), range(5, 7)]]
    with pytest.raises(ValueError, match="2p = 8 chunks, more than its 7 layers"):
        assign_layers(7, p=4, layout="v")
    with pytest.raises(ValueError, match="two chunks per rank"):
        as_schedule([["F0"]], layout="v", v=3)
    # Rank 0 holds the first and the last chunk: it computes the loss and starts the backward.
    assert " ".join(map(str, s[0])).startswith("F0 F1 F2 F3 F4 F5 F6 F0.1 B0.1")


@pytest.mark.parametrize("p,m", [(1, 1), (1, 4), (2, 1), (2, 5), (3, 2), (3, 7), (4, 4), (4, 8),
                                 (5, 11), (6, 12), (8, 16)])
def test_zb_v_is_valid_data_and_round_trips_through_text(p, m):
    s = zb_v(p, m)
    assert problems(s, p=p, m=m, v=2) == []
    assert make_schedule("ZB_V", p=p, m=m) == s
    text = [[str(op) for op in ops] for ops in s.stages]
    assert as_schedule(text, layout="v").stages == s.stages
    assert sum(op.kind == "W" for ops in s.stages for op in ops) == 2 * p * m


def test_the_validator_reads_the_v_layout():
    rows = [[str(op) for op in ops] for ops in zb_v(2, 2).stages]
    # Rank 0's loss needs its own chunk-1 forward: a backward of chunk 1 before it is an order
    # problem; a chunk-1 forward before rank 1 has turned the micro-batch round is a deadlock.
    bad = [["B0.1"] + [op for op in rows[0] if op != "B0.1"], rows[1]]
    assert "order" in kinds(problems(bad, layout="v"))
    first = rows[0].index("F0.1")
    stuck = [["F0.1"] + rows[0][:first] + rows[0][first + 1:], rows[1]]
    found = problems(stuck, layout="v")
    assert kinds(found) == ["deadlock"] and "stage 0 is stuck at F0.1 (step 0)" in found[0].message


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 6, 8])
def test_zb_v_idles_only_while_the_pipeline_fills_at_equal_times(p):
    """t_F = t_B = t_W (the authors' table): every stage idles (p − 1)·t_F/2 in one step, the
    last rank's wait for its first input, which no schedule avoids."""
    for m in sorted({p, 2 * p, 2 * p + 1, 3 * p, 4 * p}):
        t = simulate(zb_v(p, m), forward=1, backward=1, weight=1)
        want = step_time("zb-v", p=p, m=m, forward=1, backward=1, weight=1)
        assert t.makespan == pytest.approx(want, abs=1e-9), (p, m)
        assert t.bubble == pytest.approx(
            bubble_fraction("zb-v", p=p, m=m, forward=1, backward=1, weight=1), abs=1e-12)
        assert bubble_time("zb-v", p=p, m=m, forward=1, backward=1, weight=1) == (p - 1) / 2
        # Half of ZB-H1's idle time, a sixth of 1F1B's.
        assert 2 * bubble_time("zb-v", p=p, forward=1, backward=1, weight=1) == bubble_time(
            "zb-h1", p=p, forward=1, backward=1, weight=1)


@pytest.mark.parametrize("p,m", [(2, 4), (2, 5), (2, 8), (4, 8), (4, 9), (4, 12), (4, 16),
                                 (6, 12), (6, 13), (6, 18), (8, 16), (8, 17)])
def test_zb_v_stages_never_wait_between_their_first_and_last_op(p, m):
    """The authors' zero: counted from each stage's own first op (the next step's fill can then
    overlap this step's drain), a parallelogram. Not every (p, m): odd p, and p = 8 with
    m >= 3p, keep one or two idle slots (see the next test)."""
    t = simulate(zb_v(p, m), forward=1, backward=1, weight=1).table
    assert idle_within(t) == pytest.approx([0.0] * p, abs=1e-9), (p, m)
    for r in range(p):
        assert t[t.stage == r].start.min() == pytest.approx(r / 2)    # r chunk forwards


def test_zb_v_where_its_zero_does_not_hold():
    assert max(idle_within(simulate(zb_v(3, 6), forward=1, backward=1, weight=1).table)) > 0
    # Unequal times: the order built at equal times no longer reaches the bound.
    for f, b, w in [(1, 2, 1), (1, 1, 0.5), (1, 1, 0)]:
        got = simulate(zb_v(4, 8), forward=f, backward=b, weight=w).makespan
        assert got > step_time("zb-v", p=4, m=8, forward=f, backward=b, weight=w) + 1e-9


@pytest.mark.parametrize("p", [1, 2, 3, 4, 6, 8])
def test_zb_v_holds_1f1b_stage_0_activations_on_every_stage(p):
    """Activation memory 1× 1F1B's (the authors' table): at most 2p half-stage chunk sets,
    a set past its B counting 1/2, i.e. p micro-batches, reached on every stage for m >= 2p."""
    for m in sorted({1, p, 2 * p, 3 * p}):
        s = zb_v(p, m)
        held = [x * s.share for x in peak_held(s, weight_share=0.5)]
        assert max(held) <= p
        if m >= 2 * p:
            assert held == [peak_activations("zb-v", p=p, m=m, stage=r) for r in range(p)]
            assert held == [peak_activations("1f1b", p=p, m=m, stage=0)] * p
    with pytest.raises(ValueError, match="m >= 2p"):
        peak_activations("zb-v", p=4, m=4)


def test_zb_v_sends_twice_the_messages_of_1f1b():
    for p, m in [(2, 4), (4, 8), (5, 10)]:
        assert sent_messages(zb_v(p, m)) == [2 * n for n in sent_messages(one_f_one_b(p, m))]


# --- DualPipe: two directions, some backwards split ---------------------------------------------

@pytest.mark.parametrize("p,m", [(2, 4), (2, 6), (4, 8), (4, 10), (4, 16), (6, 12), (8, 16),
                                 (8, 20)])
def test_dualpipe_is_valid_mixed_data_with_p_plus_1_activations(p, m):
    s = dualpipe(p, m)
    assert (s.layout, s.mixed, s.name, s.v) == ("bidirectional", True, "dualpipe", 2)
    assert problems(s, p=p, m=m) == [] and make_schedule("DualPipe", p=p, m=m) == s
    assert {s.pipe(mb) for mb in range(m // 2)} == {0} and {s.pipe(mb) for mb in
                                                          range(m // 2, m)} == {1}
    # Table 2: activations PP + 1 on every rank, split or not.
    assert in_flight(s) == [peak_activations("dualpipe", p=p, m=m)] * p == [p + 1] * p
    assert peak_held(s, weight_share=0.0) == [p + 1] * p
    # Every rank runs F and B of every micro-batch once, on its pipeline's chunk, and a W for
    # each backward it splits: phases 3 and 7 (n − h − 1 each) and half of phase 6 (h + 1).
    for r, ops in enumerate(s.stages):
        n, h = p // 2, min(r, p - 1 - r)
        assert sum(op.kind == "F" for op in ops) == sum(op.kind == "B" for op in ops) == m
        assert sum(op.kind == "W" for op in ops) == (n - h - 1) + n
        assert len(s.split_on(r)) == (n - h - 1) + n


def test_mixed_decides_whether_a_lone_b_is_whole_or_a_missing_w():
    rows = [[str(op) for op in ops] for ops in dualpipe(2, 4).stages]
    assert problems(rows, layout="bidirectional", mixed=True) == []
    found = problems(rows, layout="bidirectional")            # every B then needs its W
    assert set(kinds(found)) == {"missing"} and "weight gradient (W)" in found[0].message
    # A lone B is the whole backward: it takes t_B + t_W, a split one t_B and its W t_W.
    t = simulate(dualpipe(2, 4), forward=1, backward=2, weight=5).table
    b = t[t.op == "B"]
    split = {(r, mb, c) for r in range(2) for mb, c in dualpipe(2, 4).split_on(r)}
    whole = [d for r, mb, c, d in zip(b.stage, b.mb, b.chunk, b.duration) if (r, mb, c)
             not in split]
    assert set(whole) == {7.0} and set(t[t.op == "W"].duration) == {5.0}


def test_dualpipe_sizes_are_checked():
    for p, m in [(3, 6), (4, 6), (4, 9)]:
        with pytest.raises(ValueError, match="p .ranks. must be even and m"):
            dualpipe(p, m)


_TIMES = [t for t in itertools.product([0.5, 1, 1.5, 2], repeat=2) for t in
          [(t[0], t[1], w) for w in (0, 0.5, 1)]]


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 10), (6, 12), (6, 16), (8, 16), (8, 18)])
def test_dualpipe_bubble_is_table_2_when_each_pair_waits_for_both_inputs(p, m):
    """(P/2 − 1)(F&B + B − 3W), B the whole backward, F&B = F + B with free messages; exact
    whenever t_F <= t_B and t_W <= t_B (t_B: the input gradient), the transformer's order."""
    s = dualpipe(p, m)
    for f, b, w in _TIMES:
        got = simulate(s, forward=f, backward=b, weight=w, pairs=True).makespan
        want = step_time("dualpipe", p=p, m=m, forward=f, backward=b, weight=w)
        if f <= b and w <= b:
            assert got == pytest.approx(want, abs=1e-9), (f, b, w)
        # Run on their own inputs (as the executor does), the two ops of a pair idle less.
        alone = simulate(s, forward=f, backward=b, weight=w).makespan
        assert alone <= got + 1e-9
    assert bubble_time("dualpipe", p=p, forward=1, backward=1, weight=1) == (p / 2 - 1) * 2


def test_dualpipe_where_table_2_does_not_hold_and_against_the_others():
    s = dualpipe(4, 8)
    # A forward longer than the input gradient: the pairs wait longer than the table counts.
    assert simulate(s, forward=2, backward=1, weight=1, pairs=True).makespan > step_time(
        "dualpipe", p=4, m=8, forward=2, backward=1, weight=1) + 1e-9
    # Table 2's ranking at t_F = t_B = t_W: DualPipe below ZB1P (ZB-H1) below 1F1B.
    times = dict(forward=1, backward=1, weight=1)
    sims = {name: simulate(make_schedule(name, p=8, m=16), **times, pairs=name == "dualpipe")
            for name in ("1f1b", "zb-h1", "dualpipe")}
    assert sims["dualpipe"].bubble < sims["zb-h1"].bubble < sims["1f1b"].bubble
    with pytest.raises(ValueError, match="pass forward="):
        bubble_fraction("dualpipe", p=4, m=8)
    with pytest.raises(ValueError, match="even p"):
        bubble_time("dualpipe", p=3, forward=1, backward=1, weight=1)


def test_pairs_that_would_wait_on_themselves_are_refused():
    # Interleaved, p = 2, v = 2: rank 0 pairs F1 with B0.1, whose gradient rank 1 sends only
    # after its F1, which needs rank 0's F1. One op at a time it runs; as a pair it cannot.
    rows = [["F0", "F0.1", "F1", "B0.1", "B0", "F1.1", "B1.1", "B1"]] * 2
    assert problems(rows) == []
    with pytest.raises(ValueError, match="stage 0 waits forever at step 2"):
        simulate(as_schedule(rows), pairs=True)
    one = one_f_one_b(3, 4)                      # one chunk: nothing to pair
    assert simulate(one, pairs=True).makespan == simulate(one).makespan


# --- real ranks ---------------------------------------------------------------------------------

@pytest.mark.multirank
@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 5)])
def test_zb_v_on_real_ranks_gives_the_unsplit_gradients(p, m):
    layers = list(TinyMLP(d_in=5, d_hidden=6, d_out=3, depth=4, seed=4).layers)   # 9 layers
    layers[2].weight.requires_grad_(False)          # a frozen weight beside a trainable bias
    x, y = torch.randn(11, 5), torch.randn(11, 3)   # 11 samples: micro-batches of unequal size
    run, trace = run_matches_reference(layers, x, y, schedule="zb-v", p=p, m=m, timeout=TIMEOUT)
    # Every op ran where the schedule put it, and each rank sent what the schedule says.
    for r in range(p):
        ran = run.table[run.table.stage == r].sort_values("start")
        assert list(zip(ran.op, ran.mb, ran.chunk)) == [(o.kind, o.mb, o.chunk)
                                                        for o in run.schedule[r]]
        assert trace.totals()[r].messages_sent == sent_messages(run.schedule)[r]


@pytest.mark.multirank
@pytest.mark.parametrize("p,m", [(2, 4), (4, 8)])
def test_dualpipe_on_real_ranks_gives_the_unsplit_gradients(p, m):
    layers = list(TinyMLP(d_in=5, d_hidden=6, d_out=3, depth=3, seed=2).layers)   # 7 layers
    x, y = torch.randn(13, 5), torch.randn(13, 3)
    run, trace = run_matches_reference(layers, x, y, schedule="dualpipe", p=p, m=m,
                                       timeout=TIMEOUT)
    # Split backwards kept their output gradients until W; whole ones none.
    for r in range(p):
        kept = {key for key, nbytes in run.grad_bytes[r].items() if nbytes > 0}
        assert kept <= set(run.schedule.split_on(r)) and kept
    # Messages: the schedule's crossings, then the replicas' gradients swapped (one each).
    for r in range(p):
        assert trace.totals()[r].messages_sent == sent_messages(run.schedule)[r] + 1
