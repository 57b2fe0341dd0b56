"""Figures of a recorded run: who called what when (`timeline`), who sent how much to whom
(`traffic_matrix`).

Both take a `toolkit.comm.Trace` (or any iterable of its `Event`s) and return a plotly figure;
they start no processes and hold no state.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Sequence

import plotly.graph_objects as go
from plotly.colors import qualitative

from ..comm.events import P2P_RECV_OPS, P2P_SEND_OPS, Event

# Fixed colours for the common ops, so a colour means the same op in every lesson; the blocking
# and async forms of a point-to-point op share a hue.
_COLORS = {"send": "#1f77b4", "isend": "#7fb2e0", "recv": "#d62728", "irecv": "#f08a8b",
           "broadcast": "#2ca02c", "all_reduce": "#9467bd", "reduce": "#ff7f0e",
           "all_gather": "#17becf", "all_gather_into_tensor": "#17becf",
           "reduce_scatter": "#e377c2", "reduce_scatter_tensor": "#e377c2",
           "scatter": "#bcbd22", "gather": "#8c564b", "all_to_all": "#ff9896",
           "all_to_all_single": "#ff9896", "barrier": "#7f7f7f", "monitored_barrier": "#7f7f7f"}
_ROW = 0.8          # height of a rank's row, in y units (1 unit between ranks)
_MIN_WIDTH = 0.002  # shortest bar drawn, as a fraction of the time span (hover keeps the truth)


def _color(op: str, extra: dict[str, str]) -> str:
    if op in _COLORS:
        return _COLORS[op]
    return extra.setdefault(op, qualitative.Dark24[len(extra) % len(qualitative.Dark24)])


def _empty(title: str, note: str) -> go.Figure:
    fig = go.Figure(layout=dict(title=title, height=240, xaxis_visible=False, yaxis_visible=False))
    fig.add_annotation(text=note, showarrow=False, font_size=16, x=0.5, y=0.5,
                       xref="paper", yref="paper")
    return fig


def greedy_lanes(spans: Sequence[tuple[float, float]]) -> list[int]:
    """The lane of each ``(start, end)`` span such that spans sharing a lane never overlap: in
    order of start, each span takes the lowest lane free at its start (greedy interval
    partitioning, which uses as few lanes as the most spans in progress at one moment)."""
    lanes = [0] * len(spans)
    lane_end: list[float] = []
    for i in sorted(range(len(spans)), key=lambda i: spans[i][0]):
        start, stop = spans[i]
        lane = next((k for k, t in enumerate(lane_end) if t <= start), len(lane_end))
        lane_end[lane:lane + 1] = [stop]
        lanes[i] = lane
    return lanes


def _lanes(events: list[Event], end: dict[int, float]) -> dict[int, tuple[float, float]]:
    """(y centre, bar height) per event index: calls of one rank that overlap in time (async
    sends and receives in flight together) share the rank's row as side-by-side lanes."""
    out: dict[int, tuple[float, float]] = {}
    by_rank: dict[int, list[int]] = defaultdict(list)
    for i, e in enumerate(events):
        by_rank[e.rank].append(i)
    for rank, idx in by_rank.items():
        idx.sort(key=lambda i: events[i].start)
        lane_of = dict(zip(idx, greedy_lanes([(events[i].start, end[i]) for i in idx])))
        groups: list[list[tuple[int, int]]] = []  # runs of overlapping calls: (index, lane)
        busy_until = -float("inf")
        for i in idx:
            if events[i].start >= busy_until:    # every lane is free: a new run starts
                groups.append([])
            busy_until = max(busy_until, end[i]) if groups[-1] else end[i]
            groups[-1].append((i, lane_of[i]))
        for group in groups:
            h = _ROW / (1 + max(lane for _, lane in group))
            for i, lane in group:
                out[i] = (rank - _ROW / 2 + (lane + 0.5) * h, h)
    return out


def _peer_text(e: Event) -> str:
    if e.peer is None:
        return "—"
    if e.op in P2P_SEND_OPS:
        return f"to rank {e.peer}"
    if e.op in P2P_RECV_OPS:
        return f"from rank {e.peer}"
    return f"root {e.peer}"


def _tensor_text(e: Event) -> str:
    return f"{e.dtype} {tuple(e.shape)}" if e.dtype else "—"


def _messages(events: list[Event]) -> list[tuple[int, int]]:
    """(send index, recv index) pairs: the k-th send from a to b meets the k-th recv on b from a."""
    sends: dict[tuple[int, int], list[int]] = defaultdict(list)
    recvs: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i in sorted(range(len(events)), key=lambda i: (events[i].rank, events[i].seq)):
        e = events[i]
        if e.peer is not None and e.op in P2P_SEND_OPS:
            sends[e.rank, e.peer].append(i)
        elif e.peer is not None and e.op in P2P_RECV_OPS:
            recvs[e.peer, e.rank].append(i)
    return [pair for key, s in sends.items() for pair in zip(s, recvs.get(key, []))]


NOTHING_RECORDED = ("no events recorded: no rank made a call while recording (did the run above "
                    "raise first, e.g. a function that is still a stub?)")


def timeline(trace: Iterable[Event], *, title: str | None = None,
             show_messages: bool = True) -> go.Figure:
    """A Gantt chart of a recorded run: one row per rank (rank 0 on top), one bar per call.

    Each bar spans a call from its start to its end (for async calls: until ``wait()``
    returned), in milliseconds since the first recorded call, coloured by op (one legend entry
    per op); hover shows op, peer, bytes, dtype, shape and duration. Calls that never completed
    (an isend/irecv nobody waited on) are hatched and drawn up to the last recorded time. Calls
    of one rank that overlap in time split its row into lanes. With `show_messages`, a grey
    arrow joins the start of each send to the end of the recv that took it (the k-th send from
    rank a to rank b matches the k-th recv on b from a). Calls shorter than 0.2 % of the run
    are drawn that wide so they stay visible; hover gives the true duration.
    """
    events = list(trace)
    dropped = getattr(trace, "dropped", 0)
    title = title or f"Communication timeline ({len(events):,} calls)"
    if dropped:
        title += f" — {dropped:,} more not recorded (event cap)"
    if not events:
        return _empty(title, NOTHING_RECORDED)
    t0 = min(e.start for e in events)
    t_last = max(e.end if e.end is not None else e.start for e in events)
    end = {i: (e.end if e.end is not None else t_last) for i, e in enumerate(events)}
    span = max(t_last - t0, 1e-9)
    lanes = _lanes(events, end)
    ms = 1e3

    fig = go.Figure()
    extra: dict[str, str] = {}
    by_op: dict[str, list[int]] = defaultdict(list)
    for i, e in enumerate(events):
        by_op[e.op].append(i)
    order = list(_COLORS)  # the legend lists ops in one fixed order across figures
    for op, idx in sorted(by_op.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order
                                                         else len(order), kv[0])):
        open_ = [events[i].end is None for i in idx]
        fig.add_trace(go.Bar(
            name=op, orientation="h",
            base=[(events[i].start - t0) * ms for i in idx],
            x=[max(end[i] - events[i].start, span * _MIN_WIDTH) * ms for i in idx],
            y=[lanes[i][0] for i in idx], width=[lanes[i][1] for i in idx],
            marker=dict(color=_color(op, extra), line_width=0,
                        pattern_shape=["/" if o else "" for o in open_]),
            customdata=[[events[i].rank, _peer_text(events[i]), f"{events[i].nbytes:,}",
                         _tensor_text(events[i]),
                         f"{(events[i].start - t0) * ms:.3f} ms",
                         "never completed (no wait())" if o
                         else f"{(end[i] - events[i].start) * ms:.3f} ms"]
                        for i, o in zip(idx, open_)],
            hovertemplate=(f"<b>{op}</b> on rank %{{customdata[0]}}<br>peer: %{{customdata[1]}}"
                           "<br>bytes: %{customdata[2]}<br>tensor: %{customdata[3]}"
                           "<br>start: %{customdata[4]}<br>duration: %{customdata[5]}"
                           "<extra></extra>")))
    if show_messages:
        xs: list[float | None] = []
        ys: list[float | None] = []
        text: list[str] = []
        for s, r in _messages(events):
            xs += [(events[s].start - t0) * ms, (end[r] - t0) * ms, None]
            ys += [lanes[s][0], lanes[r][0], None]
            note = f"rank {events[s].rank} → rank {events[r].rank}: {events[s].nbytes:,} bytes"
            text += [note, note, ""]
        if xs:
            fig.add_trace(go.Scatter(
                x=xs, y=ys, mode="lines+markers", name="message", text=text,
                hovertemplate="%{text}<extra></extra>",
                line=dict(color="rgba(60,60,60,0.6)", width=1),
                marker=dict(symbol="arrow", angleref="previous", color="rgba(60,60,60,0.8)",
                            size=[0, 9, 0] * (len(xs) // 3))))
    if any(e.end is None for e in events):
        fig.add_annotation(text="hatched: never completed (no wait())", showarrow=False,
                           xref="paper", yref="paper", x=1, y=1.02, xanchor="right",
                           yanchor="bottom", font_size=11)
    ranks = sorted({e.rank for e in events})
    fig.update_layout(
        title=title, barmode="overlay", height=140 + 55 * len(ranks), legend_title_text="op",
        xaxis_title="time since the first call (ms)", margin=dict(l=70, r=20, t=60, b=50),
        yaxis=dict(tickvals=ranks, ticktext=[f"rank {r}" for r in ranks], autorange="reversed",
                   zeroline=False, showgrid=False))
    return fig


def traffic_matrix(trace: Iterable[Event], *, title: str | None = None) -> go.Figure:
    """A heatmap of point-to-point bytes sent from rank i (row) to rank j (column).

    Counts send and isend calls (the payload, exact); collectives are left out because the
    recorder only sees what a rank passes in, not what the backend moves. Every cell carries
    its byte count; rank 0 is the top row.
    """
    events = list(trace)
    title = title or "Point-to-point bytes sent (row → column)"
    if not events:
        return _empty(title, NOTHING_RECORDED)
    world = 1 + max(max(e.rank, e.peer if e.peer is not None else 0) for e in events)
    sent = [[0] * world for _ in range(world)]
    count = [[0] * world for _ in range(world)]
    for e in events:
        if e.op in P2P_SEND_OPS and e.peer is not None:
            sent[e.rank][e.peer] += e.nbytes
            count[e.rank][e.peer] += 1
    labels = [f"rank {r}" for r in range(world)]
    fig = go.Figure(go.Heatmap(
        z=sent, x=labels, y=labels, colorscale="Blues", colorbar_title="bytes",
        text=[[f"{b:,}" for b in row] for row in sent], texttemplate="%{text}",
        customdata=count, hovertemplate=("%{y} → %{x}: %{text} bytes in %{customdata} "
                                         "message(s)<extra></extra>")))
    if not any(map(any, sent)):
        title += " — no point-to-point messages in this trace"
    size = 160 + 60 * world
    fig.update_layout(title=title, height=size, width=size + 120,
                      xaxis=dict(title="to", side="top", constrain="domain"),
                      yaxis=dict(title="from", autorange="reversed", scaleanchor="x"))
    return fig
