"""toolkit.pipeline's pure parts: schedules as data, the validator's named problems, the bubble
formulas against the simulator, and the Gantt figure and explorer built on them (no ranks)."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest

from toolkit.pipeline import (
    Op, ScheduleError, as_schedule, bubble_fraction, bubble_time_ratio, check_schedule, gpipe,
    in_flight, interleaved, make_schedule, naive, one_f_one_b, peak_activations,
    pipeline_time, problems, problems_by_case, simulate,
)
from toolkit.viz.pipeline import gantt, gantt_compare
from toolkit.widgets.pipeline import pipeline_explorer, pipeline_view

MIME = "application/vnd.plotly.v1+json"


def kinds(found) -> list[str]:
    return [p.kind for p in found]


# --- schedules as data -------------------------------------------------------------------------

def test_1f1b_order_for_p4_m8_is_warmup_alternate_drain():
    s = one_f_one_b(4, 8)
    assert " ".join(map(str, s[0])) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7"
    assert " ".join(map(str, s[3])) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7"
    assert " ".join(map(str, gpipe(2, 2)[1])) == "F0 F1 B0 B1"
    assert [list(map(str, ops)) for ops in naive(3).stages] == [["F0", "B0"]] * 3


def test_interleaved_is_megatron_order_and_reduces_to_1f1b_with_one_chunk():
    s = interleaved(2, 4, 2)
    # Groups of p = 2 micro-batches, chunk 0 then chunk 1; warm-up 2(p-r-1) + (v-1)p.
    assert " ".join(map(str, s[0][:6])) == "F0 F1 F0.1 F1.1 F2 B0.1"
    assert " ".join(map(str, s[1][:4])) == "F0 F1 F0.1 B0.1"
    assert interleaved(4, 8, 1).stages == one_f_one_b(4, 8).stages
    with pytest.raises(ValueError, match=r"m \(micro-batches\) = 6 must be a multiple of p = 4"):
        interleaved(4, 6, 2)


def test_every_builtin_schedule_is_valid_for_many_sizes():
    for p in (1, 2, 3, 4, 8):
        for m in (1, 2, 3, 4, 8, 12):
            assert problems(gpipe(p, m), p=p, m=m) == []
            assert problems(one_f_one_b(p, m), p=p, m=m, max_in_flight=p) == []
            for v in (2, 3, 4):
                if m <= p or m % p == 0:
                    assert problems(interleaved(p, m, v), p=p, m=m, v=v) == [], (p, m, v)


def test_make_schedule_and_strings_round_trip():
    s = make_schedule("1F1B", p=2, m=3)
    assert as_schedule([[str(op) for op in ops] for ops in s.stages]).stages == s.stages
    assert as_schedule([[("F", 0), ("B", 0, 1)]]).stages == ((Op("F", 0), Op("B", 0, 1)),)
    with pytest.raises(ValueError, match="cannot read op 'X3'"):
        as_schedule([["X3"]])
    with pytest.raises(ValueError, match="pass m=1"):
        make_schedule("naive", p=2, m=4)
    with pytest.raises(ValueError, match="needs the 'interleaved' schedule"):
        make_schedule("gpipe", p=2, m=4, v=2)
    with pytest.raises(ValueError, match=r"m \(the number of micro-batches\) must be an int >= 1"):
        make_schedule("gpipe", p=2, m=0)
    with pytest.raises(ValueError, match="unknown schedule"):
        make_schedule("zero-bubble", p=2, m=2)


# --- the validator names the usual mistakes -----------------------------------------------------

def test_backward_before_forward_is_an_order_problem():
    found = problems([["F0", "B1", "F1", "B0"], ["F0", "B0", "F1", "B1"]])
    assert kinds(found) == ["order"] and found[0].stage == 0
    assert "B1 (step 1) comes before F1 (step 2)" in found[0].message


def test_missing_duplicate_and_out_of_range_ops():
    found = problems([["F0", "F0", "B0"], ["F0", "B0", "F5"]], p=2, m=2)
    assert set(kinds(found)) == {"missing", "duplicate", "shape"}
    text = " | ".join(map(str, found))
    assert "stage 0: no forward of micro-batch 1" in text
    assert "stage 0: F0 appears 2 times" in text
    assert "stage 1: op F5 is not an F or B of micro-batch 0 … 1" in text
    assert kinds(problems(gpipe(2, 2), p=3)) == ["shape"]
    assert kinds(problems([])) == ["shape"] and kinds(problems([[]])) == ["shape"]


def test_sends_and_receives_in_different_orders_are_a_mismatch():
    # Stage 1 takes micro-batch 1's activation first; stage 0 sends micro-batch 0's first.
    found = problems([["F0", "F1", "B0", "B1"], ["F1", "F0", "B0", "B1"]])
    assert "mismatch" in kinds(found)
    msg = next(p.message for p in found if p.kind == "mismatch")
    assert "stage 0 sends activations to stage 1 for micro-batches [0, 1]" in msg
    assert "receives them as [1, 0]" in msg


def test_a_cycle_of_waits_is_a_deadlock_with_every_stuck_stage_named():
    # Stage 0 wants B0 (needs stage 1's gradient) before sending F1; stage 1 wants F1 first.
    found = problems([["F0", "B0", "F1", "B1"], ["F0", "F1", "B0", "B1"]])
    assert kinds(found) == ["deadlock"]
    msg = found[0].message
    assert "deadlock after 2 of 8 ops" in msg
    assert "stage 0 is stuck at B0 (step 1), waiting for the gradient of micro-batch 0 from " \
           "stage 1" in msg
    assert "stage 1 is stuck at F1 (step 1), waiting for the activation of micro-batch 1" in msg
    with pytest.raises(ScheduleError, match="deadlock"):
        check_schedule([["F0", "B0", "F1", "B1"], ["F0", "F1", "B0", "B1"]])


def test_too_many_in_flight_gpipe_is_not_1f1b():
    found = problems(gpipe(4, 8), max_in_flight=4)
    assert set(kinds(found)) == {"in_flight"} and len(found) == 4
    assert "stage 0 holds 8 micro-batches in flight" in found[0].message


def test_a_student_writing_1f1b_for_stage_0():
    good = [str(op) for op in one_f_one_b(4, 6)[0]]
    others = [[str(op) for op in one_f_one_b(4, 6)[r]] for r in (1, 2, 3)]
    assert problems([good] + others, p=4, m=6, max_in_flight=4) == []
    forgot = [op for op in good if op != "B5"]
    assert kinds(problems([forgot] + others, p=4, m=6)) == ["missing"]


def test_interleaved_mismatch_names_micro_batch_and_sending_chunk():
    rows = [[str(op) for op in ops] for ops in interleaved(2, 4, 2).stages]
    rows[1][0], rows[1][1] = rows[1][1], rows[1][0]          # stage 1: F1 before F0
    found = [p for p in problems(rows) if p.kind == "mismatch"]
    assert found and "receives them as [1, 0, 0.1, 1.1" in found[0].message
    assert "mb.c: micro-batch mb from the sender's chunk c" in found[0].message


def test_problems_by_case_grades_a_schedule_function():
    def gpipe_student(p, m):           # a correct GPipe, graded as if it claimed to be 1F1B
        return [[f"F{i}" for i in range(m)] + [f"B{i}" for i in range(m)] for _ in range(p)]

    def buggy(p, m):
        if m > 2:
            raise IndexError("list index out of range")
        return [["B0", "F0"] + [f"F{i}" for i in range(1, m)] + [f"B{i}" for i in range(1, m)]
                for _ in range(p)]

    graded = problems_by_case(gpipe_student, [(2, 1), (4, 8)], max_in_flight=lambda p, m: p)
    assert graded[2, 1] == [] and set(kinds(graded[4, 8])) == {"in_flight"}
    assert graded[4, 8][0].message.startswith("gpipe_student(4, 8): stage 0 holds 8")
    graded = problems_by_case(buggy, [(2, 2), (2, 4)])
    assert set(kinds(graded[2, 2])) == {"order"}
    assert [str(p) for p in graded[2, 4]] == [
        "buggy(2, 4): raised IndexError: list index out of range"]
    assert problems_by_case(lambda p, m, v: interleaved(p, m, v), [(2, 4, 2)]) == {(2, 4, 2): []}


# --- bubble math --------------------------------------------------------------------------------

def test_bubble_formulas_published_values():
    assert bubble_fraction("gpipe", p=4, m=8) == pytest.approx(3 / 11)
    assert bubble_fraction("naive", p=4, m=8) == pytest.approx(3 / 4)       # m is 1 for naive
    assert bubble_fraction("interleaved", p=4, m=8, v=2) == pytest.approx(3 / 19)
    assert bubble_time_ratio(p=8, m=32, v=4) == pytest.approx(7 / 128)      # (p-1)/(v m)
    with pytest.raises(ValueError, match="multiple of p"):
        bubble_fraction("interleaved", p=4, m=6, v=2)
    assert [peak_activations("1f1b", p=4, m=8, stage=r) for r in range(4)] == [4, 3, 2, 1]
    assert peak_activations("gpipe", p=4, m=8, stage=3) == 8


@pytest.mark.parametrize("ratio", [1.0, 2.0, 3.5])
def test_simulator_reproduces_the_formulas_exactly_with_equal_times(ratio):
    for p in (1, 2, 3, 4, 8):
        for m in (1, 2, 4, 8, 16):
            for name in ("gpipe", "1f1b"):
                t = simulate(make_schedule(name, p=p, m=m), forward=1.0, backward=ratio)
                assert t.bubble == pytest.approx(bubble_fraction(name, p=p, m=m), abs=1e-12)
                assert t.makespan == pytest.approx(pipeline_time(p=p, m=m, forward=1.0,
                                                                 backward=ratio))
            for v in (2, 4):
                if m % p == 0:
                    t = simulate(interleaved(p, m, v), forward=1.0, backward=ratio)
                    want = Fraction(p - 1, v * m + p - 1)
                    assert t.bubble == pytest.approx(float(want), abs=1e-12), (p, m, v)


def test_simulated_peak_activations_match_the_formula():
    for p in (2, 4):
        for m in (1, 4, 8):
            for r in range(p):
                assert in_flight(gpipe(p, m))[r] == peak_activations("gpipe", p=p, m=m, stage=r)
                assert in_flight(one_f_one_b(p, m))[r] == peak_activations("1f1b", p=p, m=m,
                                                                           stage=r)
                if m % p == 0:
                    assert in_flight(interleaved(p, m, 2))[r] / 2 == peak_activations(
                        "interleaved", p=p, m=m, v=2, stage=r)


def test_communication_time_adds_two_trips_through_the_pipeline():
    p, m, f, b, c = 4, 8, 1.0, 2.0, 0.25
    t = simulate(gpipe(p, m), forward=f, backward=b, comm=c)
    assert t.makespan == pytest.approx((m + p - 1) * (f + b) + 2 * (p - 1) * c)
    # Unbalanced stages: the slowest stage sets the pace of the steady state.
    slow = simulate(one_f_one_b(p, m), forward=[1, 1, 2, 1], backward=[2, 2, 4, 2])
    assert slow.makespan > simulate(one_f_one_b(p, m), forward=1, backward=2).makespan
    t = simulate(naive(2), forward=1, backward=1).table
    assert list(zip(t.stage, t.op, t.start, t.end)) == [
        (0, "F", 0.0, 1.0), (0, "B", 3.0, 4.0), (1, "F", 1.0, 2.0), (1, "B", 2.0, 3.0)]


def test_simulate_refuses_a_broken_schedule():
    with pytest.raises(ScheduleError, match="deadlock"):
        simulate(as_schedule([["F0", "B0", "F1", "B1"], ["F0", "F1", "B0", "B1"]]))


# --- figures and the explorer -------------------------------------------------------------------

def test_gantt_draws_every_op_with_its_micro_batch_and_the_idle_share_per_stage():
    t = simulate(one_f_one_b(2, 2), forward=1, backward=2).table
    fig = gantt(t, seconds=False, title="1F1B")
    assert fig.layout.title.text == "1F1B — bubble 33.3%"     # (p-1)/(m+p-1) = 1/3
    ops = [tr for tr in fig.data if tr.name in ("forward", "backward")]
    assert sorted(x for tr in ops for x in tr.text) == ["0", "0", "0", "0", "1", "1", "1", "1"]
    idle = next(tr for tr in fig.data if tr.name == "idle")
    assert list(idle.y) == ["stage 0 · idle 33%", "stage 1 · idle 33%"]
    fwd = next(tr for tr in fig.data if tr.name == "forward")
    # stage 0: F0 at 0, F1 at 1; stage 1: F0 at 1, then B0 (2 … 4), then F1 at 4.
    assert sorted(fwd.base) == [0.0, 1.0, 1.0, 4.0]
    with pytest.raises(ValueError, match="lacks columns"):
        gantt(t.drop(columns="mb"))


def test_gantt_compare_puts_measured_above_ideal_on_one_axis():
    a = simulate(gpipe(2, 4), forward=0.01, backward=0.02, comm=0.002).table
    b = simulate(gpipe(2, 4), forward=0.01, backward=0.02).table
    fig = gantt_compare(a, b)
    titles = [ann.text for ann in fig.layout.annotations]
    assert titles[0].startswith("measured — bubble")
    assert titles[1] == "ideal (simulated) — bubble 20.0%"
    assert fig.layout.xaxis2.title.text == "ms"


def test_explorer_view_and_redraw():
    fig, verdict = pipeline_view(schedule="interleaved", p=4, m=8, v=2, ratio=2)
    assert "simulated bubble <b>15.8%</b>" in verdict and "= <b>15.8%</b>" in verdict
    _, odd = pipeline_view(schedule="interleaved", p=4, m=6, v=2)
    assert "multiple of p = 4" in odd
    ex = pipeline_explorer(schedule="gpipe", p=4, m=8)
    assert "27.3%" in ex.verdict.value and ex.v.disabled
    (out,) = ex.output.outputs
    json.dumps(out)
    assert out["data"][MIME]["layout"]["title"]["text"].startswith("gpipe, p = 4, m = 8")
    ex.m.value = 1                                # as if a student dragged the slider
    assert "75.0%" in ex.verdict.value and "m = 1" in ex.figure.layout.title.text
    ex.schedule.value = "naive"
    assert ex.m.disabled
    with pytest.raises(ValueError, match="p must be an int in 1 … 8"):
        pipeline_explorer(p=9)
