"""Lesson 11's explorer: schedule × p × m × how the backward splits into B and W, over a
simulated Gantt chart, what each stage holds, and the bubble against the paper's formula.

    from toolkit.widgets.schedules import schedules_explorer
    schedules_explorer(schedule="zb-h1", p=4, m=8)   # last line of a cell

Time unit: one micro-batch's forward through one stage (t_F = 1). The backward takes `ratio`
of it in all; a share `w_share` of that is the weight gradient W (the rest, B, the input
gradient). Schedules that do not split the backward (GPipe, 1F1B, Chimera, TeraPipe) run it as
one op of `ratio`, so the slider changes only ZB-H1, ZB-V and DualPipe (whose F&B pairs start
once both inputs are in, as its Table 2 counts them). `comm` is the time of one message. A thin
shell like `toolkit.widgets.pipeline`: `schedules_view` maps the values to (figure, verdict) and
is tested without a browser; the explorer holds the controls.
"""

from __future__ import annotations

import html

import ipywidgets as W
import plotly.graph_objects as go

from ..arguments import check_int
from ..pipeline import bubble_fraction, held_at_peak, make_schedule, simulate
from ..viz.pipeline import gantt_memory
from .base import SLOW, SliderExplorer

SCHEDULES = ("1f1b", "zb-h1", "zb-v", "chimera", "dualpipe", "terapipe", "gpipe")
SPLIT = ("zb-h1", "zb-v", "dualpipe")
"""The schedules whose backward is split into B and W (the `W share` slider)."""
"""What the schedule menu offers."""
P_MAX, M_MAX = 8, 16
_PAPERS = {"1f1b": "(p−1)/(m+p−1), Narayanan et al. 2021",
           "gpipe": "(p−1)/(m+p−1), Huang et al. 2019",
           "terapipe": "(p−1)/(m+p−1) with equal slices, Li et al. 2021",
           "zb-h1": "(p−1)(t_F+t_B−t_W) idle, Qi et al. 2024, Table 2",
           "zb-v": "(p−1)·t_F/2 idle, the fill; 0 from each stage's first op, Qi et al.",
           "chimera": "(p−2)/(2m+p−2), Li & Hoefler 2021, Table 2",
           "dualpipe": "(p/2−1)(F&B + B − 3W) idle, DeepSeek-V3 report, Table 2"}


def _blank(message: str) -> tuple[go.Figure, str]:
    fig = go.Figure(layout=dict(title="no schedule for these values", height=200,
                                xaxis_visible=False, yaxis_visible=False))
    return fig, f"<b>{html.escape(message)}</b>"


def schedules_view(*, schedule: str = "zb-h1", p: int = 4, m: int = 8, ratio: float = 2.0,
                   w_share: float = 0.5, comm: float = 0.0) -> tuple[go.Figure, str]:
    """What the explorer shows for these values: (Gantt + memory figure, HTML verdict)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedules_view: schedule must be one of {SCHEDULES}, got {schedule!r}")
    if not ratio > 0 or not 0 <= w_share <= 1 or not comm >= 0:
        raise ValueError(f"schedules_view: ratio (t_backward / t_F) must be > 0, w_share in "
                         f"0 … 1 and comm >= 0; got {ratio}, {w_share}, {comm}")
    try:
        sched = make_schedule(schedule, p=p, m=m)
    except ValueError as err:
        return _blank(str(err))
    t_b, t_w = ratio * (1 - w_share), ratio * w_share
    run = simulate(sched, forward=1.0, backward=t_b, weight=t_w, comm=comm,
                   pairs=schedule == "dualpipe")
    held = [(full * sched.share, waiting * sched.share) for full, waiting in held_at_peak(sched)]
    chunks = {"bidirectional": {0: "down", 1: "up"}, "v": {0: "down", 1: "back up"}}.get(
        sched.layout)
    fig = gantt_memory(run.table, held, p=p, chunks=chunks,
                       title=f"{schedule}, p = {p}, m = {m}")
    try:
        times = dict(forward=1.0, backward=t_b, weight=t_w) if schedule in SPLIT else {}
        formula = f"<b>{bubble_fraction(schedule, p=p, m=m, **times):.1%}</b>"
    except ValueError as err:
        formula = f"not defined here ({html.escape(str(err).split(': ', 1)[-1])})"
    verdict = (f"simulated bubble <b>{run.bubble:.1%}</b>; the paper's formula "
               f"[{_PAPERS[schedule]}] gives {formula}. ")
    if schedule == "zb-h1" and t_w > min(1.0, t_b):
        verdict += ("t_W is longer than t_F or t_B here, so the delayed W no longer fit the "
                    "drain: the formula undercounts. ")
    if comm > 0:
        verdict += "Messages cost time: the formulas leave that out. "
    busiest = max(range(p), key=lambda r: (sum(held[r]), held[r][1]))
    verdict += (f"Stage 0 holds {sum(held[0]):g} micro-batches' activations at its peak, stage "
                f"{busiest} the most ({sum(held[busiest]):g}"
                + (f", {held[busiest][1]:g} of them waiting for their W" if held[busiest][1]
                   else "") + ").")
    return fig, verdict


class SchedulesExplorer(SliderExplorer):
    """A `schedule` menu and sliders `p`, `m`, `ratio`, `w_share`, `comm` over
    `schedules_view`; `SliderExplorer`'s `verdict`, `output`, `widget`, `figure`."""

    def __init__(self, *, schedule: str, p: int, m: int, ratio: float, w_share: float,
                 comm: float) -> None:
        style = {"description_width": "110px"}
        super().__init__(
            self._view, rows=[["schedule", "p", "m"], ["ratio", "w_share", "comm"]],
            schedule=W.Dropdown(options=list(SCHEDULES), value=schedule,
                                description="schedule", style=style),
            p=W.IntSlider(value=p, min=2, max=P_MAX, description="stages p", style=style,
                          **SLOW),
            m=W.IntSlider(value=m, min=1, max=M_MAX, description="micro-batches m",
                          style=style, **SLOW),
            ratio=W.FloatSlider(value=ratio, min=0.5, max=4.0, step=0.25,
                                description="t_backward / t_F", style=style, **SLOW),
            w_share=W.FloatSlider(value=w_share, min=0.0, max=1.0, step=0.05,
                                  description="W share", style=style, **SLOW),
            comm=W.FloatSlider(value=comm, min=0.0, max=1.0, step=0.05,
                               description="message / t_F", style=style, **SLOW))

    def _view(self, *, schedule: str, **rest: float) -> tuple[go.Figure, str]:
        self.w_share.disabled = schedule not in SPLIT
        return schedules_view(schedule=schedule, **rest)


def schedules_explorer(*, schedule: str = "zb-h1", p: int = 4, m: int = 8, ratio: float = 2.0,
                       w_share: float = 0.5, comm: float = 0.0) -> SchedulesExplorer:
    """An explorer of the schedules past 1F1B: the simulated Gantt chart, the activations each
    stage holds, and the bubble against its paper's formula, for p ≤ 8 and m ≤ 16."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedules_explorer: schedule must be one of {SCHEDULES}, "
                         f"got {schedule!r}")
    check_int("schedules_explorer", "p", p, low=2, high=P_MAX)
    check_int("schedules_explorer", "m", m, high=M_MAX)
    return SchedulesExplorer(schedule=schedule, p=p, m=m, ratio=float(ratio),
                             w_share=float(w_share), comm=float(comm))


__all__ = ["M_MAX", "P_MAX", "SCHEDULES", "SPLIT", "SchedulesExplorer", "schedules_explorer",
           "schedules_view"]
