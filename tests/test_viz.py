"""Figures are pure functions of recorded events: check what they draw, not how it looks."""

from __future__ import annotations

import plotly.graph_objects as go

from toolkit import viz
from toolkit.comm import Event, Trace


def ev(rank, seq, op, peer, nbytes, start, end):
    return Event(rank, seq, op, peer, nbytes, "float32", (nbytes // 4,), start, end)


def two_rank_trace() -> Trace:
    return Trace([
        ev(0, 0, "send", 1, 4000, 10.000, 10.002),
        ev(1, 0, "recv", 0, 4000, 10.000, 10.003),
        ev(0, 1, "all_reduce", None, 8, 10.004, 10.006),
        ev(1, 1, "all_reduce", None, 8, 10.004, 10.006),
        ev(1, 2, "isend", 0, 40, 10.007, None),  # never waited on
    ])


def bars(fig: go.Figure) -> dict[str, go.Bar]:
    return {t.name: t for t in fig.data if isinstance(t, go.Bar)}


def test_timeline_one_bar_per_call_grouped_by_op_in_ms_rows_per_rank():
    fig = viz.timeline(two_rank_trace())
    b = bars(fig)
    assert set(b) == {"send", "recv", "all_reduce", "isend"}
    assert list(b["send"].base) == [0.0]                  # ms since the first call
    assert abs(b["recv"].x[0] - 3.0) < 1e-6               # 3 ms long
    assert sorted(round(y) for y in b["all_reduce"].y) == [0, 1]   # one row per rank
    assert list(fig.layout.yaxis.tickvals) == [0, 1] and fig.layout.yaxis.autorange == "reversed"
    assert b["isend"].marker.pattern.shape == ("/",)       # the unfinished call is hatched
    assert "never completed" in b["isend"].customdata[0][5]


def test_timeline_draws_one_arrow_per_matched_message():
    fig = viz.timeline(two_rank_trace())
    (msgs,) = [t for t in fig.data if isinstance(t, go.Scatter)]
    x0, x1, gap = msgs.x                                   # send start -> recv end, in ms
    assert x0 == 0.0 and abs(x1 - 3.0) < 1e-6 and gap is None
    assert "rank 0 → rank 1: 4,000 bytes" in msgs.text[0]
    no_arrows = viz.timeline(two_rank_trace(), show_messages=False)
    assert not [t for t in no_arrows.data if isinstance(t, go.Scatter)]


def test_overlapping_async_calls_share_the_row_as_lanes():
    trace = Trace([ev(0, 0, "isend", 1, 4, 0.0, 1.0), ev(0, 1, "irecv", 1, 4, 0.1, 1.0)])
    b = bars(viz.timeline(trace))
    (y_send,), (y_recv,) = b["isend"].y, b["irecv"].y
    assert y_send != y_recv and abs(y_send - y_recv) < 0.8
    assert b["isend"].width[0] < 0.8


def test_empty_trace_says_so():
    for fig in (viz.timeline(Trace()), viz.traffic_matrix(Trace())):
        assert not fig.data and "no events recorded" in fig.layout.annotations[0].text
        assert "stub" in fig.layout.annotations[0].text  # says why a playground's plot is empty


def test_traffic_matrix_sums_sends_from_row_to_column():
    trace = Trace([ev(0, 0, "send", 1, 100, 0, 1), ev(0, 1, "isend", 1, 20, 1, 2),
                   ev(2, 0, "send", 0, 7, 0, 1), ev(1, 0, "recv", 0, 100, 0, 1)])
    (heat,) = viz.traffic_matrix(trace).data
    assert [list(row) for row in heat.z] == [[0, 120, 0], [0, 0, 0], [7, 0, 0]]
    assert heat.customdata[0][1] == 2                      # two messages 0 -> 1
