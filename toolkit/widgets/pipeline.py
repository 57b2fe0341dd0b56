"""The pipeline explorer: sliders for p, m, v, the schedule and t_b/t_f over a simulated Gantt.

    from toolkit.widgets.pipeline import pipeline_explorer
    pipeline_explorer(p=4, m=8)              # last line of a cell: sliders, a verdict, a figure

A thin shell like `toolkit.widgets.cost`: `pipeline_view` maps slider values to what is shown
(the ideal timeline from `toolkit.pipeline.simulate`, drawn by `toolkit.viz.pipeline.gantt`, and
a sentence comparing its bubble with the formula) and is tested without a browser; the explorer
object holds the sliders and puts that view into its `Output` area on every change.
"""

from __future__ import annotations

import html

import ipywidgets as W
import plotly.graph_objects as go

from ..arguments import check_int
from ..pipeline import CLASSIC, bubble_fraction, in_flight, make_schedule, simulate
from ..viz.pipeline import gantt
from .base import SliderExplorer

SCHEDULES = CLASSIC
"""What the schedule menu offers: lesson 10's schedules (lesson 11's explorer has the rest)."""
P_MAX, M_MAX, V_MAX = 8, 16, 4   # slider ranges: enough to see the trends, small enough to read


def pipeline_view(*, schedule: str = "1f1b", p: int = 4, m: int = 8, v: int = 2,
                  ratio: float = 2.0) -> tuple[go.Figure, str]:
    """What the explorer shows for these slider values: (Gantt figure, HTML verdict).

    Time unit: the forward of the whole batch through one stage. A micro-batch's forward takes
    1/m of it and its backward `ratio`/m, so more micro-batches mean shorter ops, not more
    work. Naive uses m = 1 and only the interleaved schedule uses v (the others ignore them).
    """
    notes = []
    if schedule == "naive" and m != 1:
        notes.append(f"naive runs the whole batch at once: m = {m} ignored")
        m = 1
    if schedule != "interleaved":
        v = 1
    if ratio <= 0:
        raise ValueError(f"pipeline_view: ratio (t_b / t_f) must be > 0, got {ratio}")
    try:
        sched = make_schedule(schedule, p=p, m=m, v=v)
    except ValueError as err:
        fig = go.Figure(layout=dict(title="no schedule for these values", height=200,
                                    xaxis_visible=False, yaxis_visible=False))
        return fig, f"<b>{html.escape(str(err))}</b>"
    run = simulate(sched, forward=1.0 / m, backward=ratio / m)
    title = f"{schedule}, p = {p}, m = {m}" + (f", v = {v}" if schedule == "interleaved" else "")
    fig = gantt(run.table, title=title, p=p, seconds=False)
    try:
        formula = bubble_fraction(schedule, p=p, m=m, v=v)
        form = ("(p−1)/(v·m+p−1)" if schedule == "interleaved" else "(p−1)/(m+p−1)")
        verdict = (f"simulated bubble <b>{run.bubble:.1%}</b>; formula {form} = "
                   f"<b>{formula:.1%}</b>")
    except ValueError:
        verdict = (f"simulated bubble <b>{run.bubble:.1%}</b>; the interleaved formula holds "
                   f"only when p divides m")
    peak = in_flight(sched)[0] / sched.v
    verdict += (f". One step takes {run.makespan:.3g} units for {1 + ratio:g} units of work per "
                f"stage; stage 0 holds the activations of at most {peak:g} micro-batch"
                f"{'' if peak == 1 else 'es'} ({peak / m:.3g}× the whole batch's).")
    if notes:
        verdict += " (" + "; ".join(notes) + ".)"
    return fig, verdict


class PipelineExplorer(SliderExplorer):
    """Sliders `p`, `m`, `v`, `ratio` and a `schedule` menu over `pipeline_view`, and
    `SliderExplorer`'s `verdict`, `output`, `widget`, `figure`. Setting a control's ``.value``
    in code redraws too.
    """

    def __init__(self, *, schedule: str, p: int, m: int, v: int, ratio: float) -> None:
        slow = dict(continuous_update=False, style={"description_width": "90px"})
        super().__init__(
            self._view, rows=[["schedule", "ratio"], ["p", "m", "v"]],
            schedule=W.Dropdown(options=list(SCHEDULES), value=schedule,
                                description="schedule", style=slow["style"]),
            p=W.IntSlider(value=p, min=1, max=P_MAX, description="stages p", **slow),
            m=W.IntSlider(value=m, min=1, max=M_MAX, description="micro-batches m", **slow),
            v=W.IntSlider(value=v, min=1, max=V_MAX, description="chunks v", **slow),
            ratio=W.FloatSlider(value=ratio, min=0.5, max=4.0, step=0.25,
                                description="t_b / t_f", **slow))

    def _view(self, *, schedule: str, **rest: float) -> tuple[go.Figure, str]:
        self.m.disabled = schedule == "naive"        # naive: one batch, m = 1
        self.v.disabled = schedule != "interleaved"
        return pipeline_view(schedule=schedule, **rest)


def pipeline_explorer(*, schedule: str = "1f1b", p: int = 4, m: int = 8, v: int = 2,
                      ratio: float = 2.0) -> PipelineExplorer:
    """An explorer of pipeline schedules: the simulated Gantt chart and its bubble against the
    formula, for p ≤ 8 stages, m ≤ 16 micro-batches, v ≤ 4 chunks and t_b/t_f in 0.5 … 4."""
    if schedule not in SCHEDULES:
        raise ValueError(f"pipeline_explorer: schedule must be one of {SCHEDULES}, "
                         f"got {schedule!r}")
    for arg, value, top in (("p", p, P_MAX), ("m", m, M_MAX), ("v", v, V_MAX)):
        check_int("pipeline_explorer", arg, value, high=top)
    return PipelineExplorer(schedule=schedule, p=p, m=m, v=v, ratio=float(ratio))


__all__ = ["M_MAX", "P_MAX", "SCHEDULES", "V_MAX", "PipelineExplorer", "pipeline_explorer",
           "pipeline_view"]
