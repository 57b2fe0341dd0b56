"""A recorded ring all-reduce, step by step: an animation (`ring_animation`) and a table
(`ring_table`).

Ring all-reduce (Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
workstations", JPDC 2009): p ranks on a ring, each tensor of n elements cut into p chunks
(`toolkit.collectives.chunk_bounds(n, p)`). At each of 2(p−1) steps every rank sends one chunk to
rank + 1 (mod p), so all p links carry n/p elements at once:

* steps 1 … p−1, reduce-scatter: the receiver *adds* the chunk into its own copy; a chunk gains
  one rank's contribution per hop, and after p−1 hops some rank holds it summed over all p ranks;
* steps p … 2(p−1), all-gather: the finished chunks travel on and the receiver *overwrites*.

Each rank sends 2(p−1) messages of about n/p elements: 2(p−1)/p · n in all, under 2n for any p.

Nothing here assumes that schedule: the replay reads the run recorded by
``with comm.recording(values=k) as trace: spawn(...)``. A rank's k-th message (the per-pair
`Message.index`) is step k + 1; the chunk is found from where the sent view starts in the rank's
buffer (`Event.offset`, relative to the lowest offset that rank sent, so a tensor that is itself a
view works); the values are those the send carried (`Event.values`). `initial` (each rank's input)
gives the buffers before step 1; every recorded send is checked against the replayed buffer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import plotly.graph_objects as go

from ..chunks import chunk_bounds
from ..comm.events import Trace

if TYPE_CHECKING:
    import pandas as pd

RS, AG = "reduce-scatter", "all-gather"
_OWN, _FULL = "#e8e8e8", "#31a354"   # cell colours: own input only / sum of all p ranks
_PARTIAL = ("#c6dbef", "#9ecae1", "#6baed6", "#4292c6")  # more contributions, darker blue


@dataclass(frozen=True)
class _Step:
    """One message of the replay."""

    step: int          # 1 … 2(p−1)
    phase: str         # RS or AG
    src: int
    dst: int
    chunk: int
    values: tuple
    buffer: tuple      # the receiver's whole buffer after the step
    holds: tuple       # ranks whose inputs the received chunk now sums


def _inputs(initial: Sequence[Any]) -> list[list[float]]:
    rows = [list(x.reshape(-1).tolist() if hasattr(x, "tolist") else x) for x in initial]
    p, n = len(rows), len(rows[0]) if rows else 0
    if p < 2 or any(len(r) != n for r in rows) or n < p:
        raise ValueError("initial must hold one input per rank (at least 2), all of one size of "
                         "at least p elements (no empty chunk); got sizes "
                         f"{[len(r) for r in rows]}")
    return rows


def _replay(trace: Trace, initial: Sequence[Any]) -> tuple[list[list[float]], list[list[_Step]]]:
    """(inputs, steps): each step lists one `_Step` per rank, by sender."""
    rows = _inputs(initial)
    p, n, steps = len(rows), len(rows[0]), 2 * (len(rows) - 1)
    bounds = chunk_bounds(n, p)
    most = max(hi - lo for lo, hi in bounds)
    how = (f"record the run with `with comm.recording(values={most}) as trace: spawn(...)` "
           f"(values=k keeps the elements of sends of up to k elements; a chunk here has {most})")
    messages = (trace if isinstance(trace, Trace) else Trace(trace)).messages()
    if not messages:
        raise ValueError(f"the trace holds no point-to-point messages; {how}")
    sent: dict[tuple[int, int], Any] = {}   # (rank, k) -> its k-th message, k = step - 1
    for m in messages:
        if m.send is None or m.recv is None:
            raise ValueError(f"message {m.index} from rank {m.src} to rank {m.dst} has no matching "
                             f"{'send' if m.send is None else 'receive'}: record a complete run")
        if not (0 <= m.src < p and m.dst == (m.src + 1) % p):
            raise ValueError(f"rank {m.src} sent to rank {m.dst}: not a ring of {p} ranks (each "
                             "sends to rank + 1 mod p only). Pass the trace of one "
                             "ring_all_reduce and one input per rank")
        sent[m.src, m.index] = m
    chunk: dict[tuple[int, int], int] = {}
    starts = {lo: c for c, (lo, _) in enumerate(bounds)}  # distinct, as n >= p
    for r in range(p):
        ms = [sent[r, k] for k in range(sum(key[0] == r for key in sent))]  # indices 0, 1, …
        if len(ms) != steps:
            raise ValueError(f"rank {r} sent {len(ms)} messages; a ring all-reduce on {p} ranks "
                             f"sends 2(p−1) = {steps}. Record exactly one ring_all_reduce")
        if any(m.send.values is None for m in ms):
            raise ValueError(f"the recorded sends carry no values; {how}")
        base = min(m.send.offset for m in ms)
        for k, m in enumerate(ms):
            c = chunk[r, k] = starts.get(m.send.offset - base, -1)
            if c < 0 or len(m.send.values) != bounds[c][1] - bounds[c][0]:
                raise ValueError(
                    f"rank {r}'s send {k} starts at element {m.send.offset - base} of its buffer "
                    f"with {len(m.send.values)} elements, which is not a chunk of "
                    f"chunk_bounds({n}, {p}) = {bounds}: the sends must be views of the tensor")
        for phase, ks in ((RS, range(p - 1)), (AG, range(p - 1, steps))):
            if len({chunk[r, k] for k in ks}) != p - 1:
                raise ValueError(f"rank {r} sent one chunk twice in the {phase}: the sends are "
                                 "not views of distinct chunks of the all-reduced tensor")

    state = [list(row) for row in rows]
    holds = [[frozenset({r})] * p for r in range(p)]
    out: list[list[_Step]] = []
    for k in range(steps):
        phase, row = RS if k < p - 1 else AG, []
        before, held = [list(b) for b in state], [list(h) for h in holds]  # all p sends at once
        for r in range(p):   # each rank receives one message per step
            m, c, d = sent[r, k], chunk[r, k], (r + 1) % p
            lo, hi = bounds[c]
            if not all(math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-6)
                       for a, b in zip(m.send.values, before[r][lo:hi])):
                raise ValueError(
                    f"step {k + 1}: rank {r} sent {list(m.send.values)} for chunk {c}, but "
                    f"replaying `initial` gives {before[r][lo:hi]}. Pass each rank's input "
                    "before the all-reduce, in rank order (and a sum all-reduce)")
            if phase == RS:     # add into the receiver's copy; all-gather overwrites it
                state[d][lo:hi] = [a + b for a, b in zip(state[d][lo:hi], m.send.values)]
                holds[d][c] = holds[d][c] | held[r][c]
            else:
                state[d][lo:hi], holds[d][c] = list(m.send.values), held[r][c]
            row.append(_Step(k + 1, phase, r, d, c, tuple(m.send.values), tuple(state[d]),
                             tuple(sorted(holds[d][c]))))
        out.append(row)
    return rows, out


def ring_table(trace: Trace, initial: Sequence[Any]) -> "pd.DataFrame":
    """The replay of a recorded `ring_all_reduce` as a pandas DataFrame, one row per message.

    Columns: step (1 … 2(p−1)), phase (reduce-scatter | all-gather), src, dst, chunk, sent (the
    values sent; not "values", which would hide behind `DataFrame.values`), buffer_after (the
    receiver's whole buffer after the step) and holds (the ranks whose inputs the received chunk
    now sums). The rows of the last step give every rank's final buffer. Arguments and errors
    as for `ring_animation`.
    """
    import pandas as pd

    _, steps = _replay(trace, initial)
    return pd.DataFrame(
        [dict(step=s.step, phase=s.phase, src=s.src, dst=s.dst, chunk=s.chunk,
              sent=s.values, buffer_after=s.buffer, holds=s.holds)
         for row in steps for s in row])


def _fmt(values: Sequence[float], most: int = 3, sep: str = ", ") -> str:
    return sep.join(f"{v:.4g}" for v in values[:most]) + (sep + "…" if len(values) > most else "")


def _arc(a: tuple, b: tuple, bulge: float) -> tuple[list, list, tuple]:
    """Points of a quadratic Bézier from a to b bowed `bulge` to the left of travel (out of a
    clockwise ring), and the point beyond its middle where its label goes."""
    dx, dy = b[0] - a[0], b[1] - a[1]
    d = math.hypot(dx, dy)
    nx, ny = -dy / d, dx / d
    mx, my = (a[0] + b[0]) / 2, (a[1] + b[1]) / 2
    cx, cy = mx + 2 * bulge * nx, my + 2 * bulge * ny
    ts = [i / 16 for i in range(17)]
    xs = [(1 - t) ** 2 * a[0] + 2 * t * (1 - t) * cx + t * t * b[0] for t in ts]
    ys = [(1 - t) ** 2 * a[1] + 2 * t * (1 - t) * cy + t * t * b[1] for t in ts]
    return xs, ys, (mx + (bulge + 0.13) * nx, my + (bulge + 0.13) * ny)


def ring_animation(trace: Trace, initial: Sequence[Any], *, title: str | None = None) -> go.Figure:
    """An animation of a recorded `ring_all_reduce`, with a play button and a step slider.

    Args:
        trace: from ``with comm.recording(values=k) as trace: spawn(...)`` around exactly one
            ring all-reduce (sum) on the whole world, k at least the largest chunk's elements.
        initial: each rank's input before the all-reduce (tensors or lists of numbers), in
            rank order; the rank function can return ``t.tolist()`` before reducing.
        title: the figure's title.

    Ranks sit clockwise round a ring (rank 0 on top), each with its buffer as p cells, one per
    chunk, showing the values it holds; a cell's colour says how many ranks' inputs it sums
    (grey: its own, blue: several, green: all p). Frame 0 is the inputs; frame k (1 … 2(p−1))
    draws step k's p messages as arrows rank → rank + 1 labelled with the chunk and the values
    carried, and the buffers after the step, the receiving cells outlined. Traces 0-2 (cells,
    arrows, arrow labels) change from frame to frame; trace 3 (rank and chunk names) does not.

    Raises:
        ValueError: a trace without values, not one ring all-reduce over len(initial) ranks, or
            sends that do not match a replay of `initial` (the message says what to pass).
    """
    rows, steps = _replay(trace, initial)
    p, n = len(rows), len(rows[0])
    bounds = chunk_bounds(n, p)
    w = min(0.3, 0.9 / p)                  # cell width, in units of the ring's radius
    lim, plot_px = 1 + p * w / 2 + 0.12, 520
    pos = [(math.sin(2 * math.pi * r / p), math.cos(2 * math.pi * r / p)) for r in range(p)]
    xy = {(r, c): (pos[r][0] + (c - (p - 1) / 2) * w, pos[r][1]) for r in range(p)
          for c in range(p)}
    box = (p * w / 2 + 0.05, 0.62 * w + 0.12)  # half width, half height of a rank's cells + names
    colour = [_OWN] + list(_PARTIAL[:p - 2]) + [_PARTIAL[-1]] * (p - 2 - len(_PARTIAL)) + [_FULL]

    def cells(bufs: list[list[float]], holds: dict, hit: set) -> go.Scatter:
        ks = list(xy)
        return go.Scatter(
            x=[xy[k][0] for k in ks], y=[xy[k][1] for k in ks], mode="markers+text",
            name="buffers", hoverinfo="text", showlegend=False,
            text=[_fmt(bufs[r][slice(*bounds[c])], 2, "<br>") for r, c in ks],
            textfont=dict(size=11, color=["white" if len(holds[k]) == p else "black" for k in ks]),
            marker=dict(symbol="square", size=0.92 * w / (2 * lim) * plot_px,
                        color=[colour[len(holds[k]) - 1] for k in ks],
                        line=dict(width=[3 if k in hit else 1 for k in ks],
                                  color=["#d95f02" if k in hit else "#888" for k in ks])),
            hovertext=[f"rank {r}, chunk {c} (elements {bounds[c][0]}…{bounds[c][1] - 1}): "
                       f"{_fmt(bufs[r][slice(*bounds[c])])}<br>sum of the inputs of ranks "
                       + "+".join(map(str, holds[r, c])) for r, c in ks])

    def arrows(row: list[_Step]) -> list[go.Scatter]:
        xs, ys, sizes, lx, ly = [], [], [], [], []
        for s in row:
            (x0, y0), (x1, y1) = pos[s.src], pos[s.dst]
            d = math.hypot(x1 - x0, y1 - y0)
            ux, uy = (x1 - x0) / d, (y1 - y0) / d  # leave and enter the rank boxes, not cross them
            t = min(box[0] / abs(ux) if ux else math.inf, box[1] / abs(uy) if uy else math.inf)
            ax, ay, (mx, my) = _arc((x0 + t * ux, y0 + t * uy), (x1 - t * ux, y1 - t * uy),
                                    0.45 if p == 2 else 0.2)
            xs, ys, lx, ly = xs + ax + [None], ys + ay + [None], lx + [mx], ly + [my]
            sizes += [0] * (len(ax) - 1) + [12, 0]
        return [go.Scatter(x=xs, y=ys, mode="lines+markers", name="messages", hoverinfo="skip",
                           showlegend=False, line=dict(color="#d95f02", width=2),
                           marker=dict(symbol="arrow", angleref="previous", size=sizes,
                                       color="#d95f02")),
                go.Scatter(x=lx, y=ly, mode="text", name="message labels", hoverinfo="text",
                           showlegend=False, text=[f"c{s.chunk}: {_fmt(s.values)}" for s in row],
                           textfont=dict(size=12, color="#a04000"),
                           hovertext=[f"step {s.step}, {s.phase}: rank {s.src} → rank {s.dst}, "
                                      f"chunk {s.chunk} = {list(s.values)}" for s in row])]

    head = title or f"Ring all-reduce of {n} elements on {p} ranks (recorded run)"
    bufs = [list(r) for r in rows]
    holds = {(r, c): (r,) for r in range(p) for c in range(p)}
    frames = [go.Frame(name="0", data=[cells(bufs, holds, set()), *arrows([])], traces=[0, 1, 2],
                       layout=dict(title_text=f"{head}<br><sup>start: every rank holds its own "
                                              "input (grey)</sup>"))]
    for row in steps:
        for s in row:
            bufs[s.dst][slice(*bounds[s.chunk])] = s.buffer[slice(*bounds[s.chunk])]
            holds[s.dst, s.chunk] = s.holds
        k, rs = row[0].step, row[0].phase == RS
        what = ("adds the chunk it receives into its own" if rs
                else "overwrites a chunk with the finished sum")
        frames.append(go.Frame(
            name=str(k), data=[cells(bufs, holds, {(s.dst, s.chunk) for s in row}), *arrows(row)],
            traces=[0, 1, 2], layout=dict(title_text=(
                f"{head}<br><sup>step {k}/{2 * (p - 1)}, {row[0].phase} "
                f"{k if rs else k - p + 1}/{p - 1}: each rank {what}</sup>"))))

    ks = list(xy)
    names = go.Scatter(
        x=[x for x, _ in pos] + [xy[k][0] for k in ks], mode="text", name="names",
        y=[y + 0.62 * w + 0.06 for _, y in pos] + [xy[k][1] - 0.62 * w for k in ks],
        text=[f"<b>rank {r}</b>" for r in range(p)] + [f"c{c}" for _, c in ks],
        textfont=dict(size=[13] * p + [9] * len(ks), color=["black"] * p + ["#777"] * len(ks)),
        hoverinfo="skip", showlegend=False)
    jump = dict(frame=dict(duration=0, redraw=True), transition=dict(duration=0), mode="immediate")
    go_on = dict(frame=dict(duration=1200, redraw=True), transition=dict(duration=0),
                 fromcurrent=True)
    axis = dict(range=[-lim, lim], visible=False, fixedrange=True)
    labels = ["start"] + [f"{'RS' if r[0].phase == RS else 'AG'} {r[0].step}" for r in steps]
    fig = go.Figure(data=[*frames[0].data, names], frames=frames)
    fig.update_layout(
        title_text=frames[0].layout.title.text, plot_bgcolor="white",
        width=plot_px + 20, height=plot_px + 200, margin=dict(l=10, r=10, t=80, b=120),
        xaxis=axis, yaxis=dict(axis, scaleanchor="x"),
        updatemenus=[dict(type="buttons", direction="left", x=0, y=-0.1, xanchor="left",
                          yanchor="top", buttons=[
                              dict(label="▶ play", method="animate", args=[None, go_on]),
                              dict(label="❚❚ pause", method="animate", args=[[None], jump])])],
        sliders=[dict(active=0, x=0.3, len=0.7, y=-0.02, yanchor="top", pad=dict(t=10),
                      currentvalue=dict(prefix="step: ", xanchor="right"),
                      steps=[dict(label=lab, method="animate", args=[[f.name], jump])
                             for lab, f in zip(labels, frames)])])
    return fig
