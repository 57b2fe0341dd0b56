"""Lesson 11's figures and explorer: W ops drawn in the Gantt chart, the memory panel under it,
and the explorer's verdict against each paper's formula (no ranks, no browser)."""

from __future__ import annotations

import json

import pytest

from toolkit.pipeline import chimera, held_at_peak, simulate, zb_h1
from toolkit.viz.pipeline import gantt, gantt_memory
from toolkit.widgets.pipeline import SCHEDULES as LESSON_10_SCHEDULES
from toolkit.widgets.schedules import schedules_explorer, schedules_view

MIME = "application/vnd.plotly.v1+json"


def test_gantt_draws_w_ops_green_and_names_b_the_input_gradient():
    t = simulate(zb_h1(2, 2), forward=1, backward=1, weight=1).table
    fig = gantt(t, seconds=False)
    names = {tr.name for tr in fig.data}
    assert {"forward", "input grad (B)", "weight grad (W)", "idle"} <= names
    w = next(tr for tr in fig.data if tr.name == "weight grad (W)")
    assert w.marker.color == "#2ca02c" and sorted(w.text) == ["0", "0", "1", "1"]
    # Without W ops a B is the whole backward, labelled as before.
    plain = gantt(simulate(zb_h1(2, 2), forward=1, backward=2).table.query("op != 'W'"),
                  seconds=False)
    assert "backward" in {tr.name for tr in plain.data}


def test_chimera_chunks_get_their_pipeline_names():
    t = simulate(chimera(2, 2), forward=1, backward=1).table
    names = {tr.name for tr in gantt(t, seconds=False, chunks={0: "down", 1: "up"}).data}
    assert {"forward, down", "forward, up", "backward, down", "backward, up"} <= names


def test_gantt_memory_stacks_what_waits_for_w_on_what_waits_for_b():
    s = zb_h1(4, 8)
    fig = gantt_memory(simulate(s, forward=1, backward=1, weight=1).table, held_at_peak(s),
                       title="zb")
    full = next(tr for tr in fig.data if tr.name == "held: F done, B not")
    waiting = next(tr for tr in fig.data if tr.name == "held: B done, W not")
    assert list(full.y) == [4, 3, 2, 1] and list(waiting.y) == [0, 1, 2, 3]
    assert list(waiting.base) == [4, 3, 2, 1]                 # stacked: p on every stage
    assert fig.layout.title.text == "zb — bubble 11.1%"
    with pytest.raises(ValueError, match="one \\(whole, awaiting W\\) pair per stage"):
        gantt_memory(simulate(s, forward=1, backward=1, weight=1).table, [(1, 0)])


def test_explorer_view_compares_with_each_papers_formula():
    _, verdict = schedules_view(schedule="zb-h1", p=4, m=8, ratio=2.0, w_share=0.5)
    assert "simulated bubble <b>11.1%</b>" in verdict and "gives <b>11.1%</b>" in verdict
    assert "stage 3 the most (4, 3 of them waiting for their W)" in verdict
    _, verdict = schedules_view(schedule="zb-h1", p=4, m=8, ratio=2.0, w_share=0.8)
    assert "formula undercounts" in verdict and "gives <b>-2.6%</b>" in verdict
    _, verdict = schedules_view(schedule="chimera", p=4, m=4, ratio=1.0)
    assert "simulated bubble <b>20.0%</b>" in verdict and "gives <b>20.0%</b>" in verdict
    _, verdict = schedules_view(schedule="chimera", p=4, m=2)
    assert "not defined here" in verdict
    fig, verdict = schedules_view(schedule="chimera", p=3, m=4)
    assert "must both be even" in verdict and fig.layout.title.text.startswith("no schedule")
    _, verdict = schedules_view(schedule="1f1b", p=4, m=8, comm=0.2)
    assert "Messages cost time" in verdict and "gives <b>27.3%</b>" in verdict
    with pytest.raises(ValueError, match="w_share in 0 … 1"):
        schedules_view(w_share=2.0)
    # ZB-V at t_F = t_B = t_W: only the fill, (p − 1)/2 of 24 op-times; DualPipe's pairs as
    # Table 2 counts them: (p/2 − 1)(F&B + B − 3W) = 2 of 26.
    _, verdict = schedules_view(schedule="zb-v", p=4, m=8, ratio=2.0, w_share=0.5)
    assert "simulated bubble <b>5.9%</b>" in verdict and "gives <b>5.9%</b>" in verdict
    _, verdict = schedules_view(schedule="dualpipe", p=4, m=8, ratio=2.0, w_share=0.5)
    assert "simulated bubble <b>7.7%</b>" in verdict and "gives <b>7.7%</b>" in verdict
    fig, verdict = schedules_view(schedule="dualpipe", p=4, m=6)
    assert "at least 2p" in verdict and fig.layout.title.text.startswith("no schedule")


def test_explorer_redraws_and_disables_the_split_for_unsplit_schedules():
    ex = schedules_explorer(schedule="zb-h1", p=4, m=8)
    (out,) = ex.output.outputs
    json.dumps(out)
    assert out["data"][MIME]["layout"]["title"]["text"].startswith("zb-h1, p = 4, m = 8")
    assert not ex.w_share.disabled
    ex.schedule.value = "terapipe"                    # as if a student picked it
    assert ex.w_share.disabled and "terapipe, p = 4" in ex.figure.layout.title.text
    ex.schedule.value = "zb-v"
    assert not ex.w_share.disabled and "zb-v, p = 4" in ex.figure.layout.title.text
    ex.m.value = 16
    assert "m = 16" in ex.figure.layout.title.text
    with pytest.raises(ValueError, match="p must be an int in 2 … 8"):
        schedules_explorer(p=1)
    assert LESSON_10_SCHEDULES == ("naive", "gpipe", "1f1b", "interleaved")
