"""Lesson 14's planner explorer: model, cluster, GPUs and batch in; the feasible layouts out,
as a sorted table and a chart of where each one's step time goes.

    from toolkit.widgets.planner import planner_explorer
    planner_explorer("gpt3-175b", "dgx-a100-80gb", gpus=1024, global_batch=1536)

`planner_view` is the pure mapping from the controls' values to what is shown (figure, HTML
table, verdict) and is tested without a browser; `PlannerExplorer` holds the controls and puts
that view into its `Output` area on every change (the pattern of `toolkit.widgets.cost`).
"""

from __future__ import annotations

import html

import ipywidgets as W
import plotly.graph_objects as go

from ..memory import MODELS
from ..planner import CLUSTERS, cluster, plan
from ..viz.planner import time_bars
from .base import SliderExplorer

__all__ = ["BATCH_CHOICES", "GPU_CHOICES", "PlannerExplorer", "planner_explorer",
           "planner_view"]

GPU_CHOICES = tuple(2 ** k for k in range(0, 13))
"""Accelerator counts offered: 1 … 4096."""
BATCH_CHOICES = tuple(sorted({2 ** k for k in range(0, 13)} | {96, 192, 384, 768, 1536, 3072}))
"""Global batch sizes (sequences) offered: powers of two, and GPT-3's 1536 with its halvings."""
SHOWN = ["config", "b", "memory_GiB", "step", "bubble_fraction", "mfu", "tokens_per_s"]


def _table_html(rows) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in SHOWN)
    body = []
    for r in rows.itertuples():
        cells = [r.config, str(r.b), f"{r.memory_GiB:.1f}", f"{r.step:.3g} s",
                 f"{r.bubble_fraction:.0%}", f"{r.mfu:.0%}", f"{r.tokens_per_s:,.0f}"]
        body.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def planner_view(*, model: str, cluster_name: str, gpus: int, global_batch: int,
                 recompute: bool = True, top: int = 8) -> tuple[go.Figure, str, str]:
    """What the planner explorer shows: (figure of the fastest feasible layout of each of the
    `top` fastest dp × tp × pp × cp shapes, their table as HTML, a verdict sentence).
    `recompute=False` leaves full recomputation out."""
    base = cluster(cluster_name)  # a ValueError names the presets
    try:
        where = base.with_gpus(gpus)
    except ValueError as err:  # e.g. 12 GPUs of 8-GPU nodes
        return go.Figure(), "", html.escape(str(err))
    choices = {} if recompute else {"recompute": ("none",)}
    try:
        table = plan(model, where, global_batch=global_batch, **choices)
    except ValueError as err:  # nothing divides: say so instead of raising in a widget
        return go.Figure(), "", html.escape(str(err))
    feasible = table[table.fits]
    if feasible.empty:
        least = table.sort_values("memory_GiB").iloc[0]
        return (go.Figure(), "", f"<b>nothing fits</b>: of {len(table)} layouts the leanest, "
                                 f"{html.escape(least.config)}, needs {least.memory_GiB:.1f} GiB "
                                 f"per GPU against {where.memory_bytes / 2 ** 30:.0f}.")
    best = feasible.iloc[0]
    fig = time_bars(table, top=top, title=f"{model} on {gpus} × {base.name}, "
                                          f"{global_batch} sequences per step")
    verdict = (f"{len(feasible)} of {len(table)} layouts fit; fastest: <b>"
               f"{html.escape(best.config)}</b>, {best.step:.3g} s per step, MFU "
               f"<b>{best.mfu:.0%}</b> (at an assumed 50 % of peak for the matmuls).")
    shown = feasible.drop_duplicates(subset=["dp", "tp", "pp", "cp"]).head(top)  # as the chart
    return fig, _table_html(shown), verdict


class PlannerExplorer(SliderExplorer):
    """Controls for model, cluster, GPUs, global batch and recomputation over `planner_view`.

    Attributes: `model`, `cluster`, `gpus`, `global_batch`, `recompute`; `table` (HTML, under
    the verdict), and `SliderExplorer`'s `verdict`, `output`, `widget`, `figure`.
    """

    def __init__(self, *, model: str, cluster_name: str, gpus: int, global_batch: int) -> None:
        slow = dict(continuous_update=False, style={"description_width": "90px"})
        self.table = W.HTML()
        super().__init__(
            self._view, rows=[["model", "cluster"], ["gpus", "global_batch", "recompute"]],
            extra=[self.table],
            model=W.Dropdown(options=list(MODELS), value=model, description="model"),
            cluster=W.Dropdown(options=list(CLUSTERS), value=cluster_name,
                               description="cluster"),
            gpus=W.SelectionSlider(options=GPU_CHOICES, value=gpus, description="GPUs", **slow),
            global_batch=W.SelectionSlider(options=BATCH_CHOICES, value=global_batch,
                                           description="batch (seqs)", **slow),
            recompute=W.Checkbox(value=True, description="allow full recomputation"))

    def _view(self, *, cluster: str, **rest: object) -> tuple[go.Figure, str]:
        figure, self.table.value, verdict = planner_view(cluster_name=cluster, **rest)
        return figure, verdict


def planner_explorer(model: str = "gpt2-xl", cluster_name: str = "dgx-a100-80gb", *,
                     gpus: int = 8, global_batch: int = 64) -> PlannerExplorer:
    """The planner explorer, starting at `model` (a name in `toolkit.memory.MODELS`) on `gpus`
    accelerators of the preset `cluster_name`, `global_batch` sequences per step."""
    if model not in MODELS:
        raise ValueError(f"planner_explorer: model must be one of {sorted(MODELS)}, "
                         f"got {model!r}")
    if cluster_name not in CLUSTERS:
        raise ValueError(f"planner_explorer: cluster_name must be one of {sorted(CLUSTERS)}, "
                         f"got {cluster_name!r}")
    if gpus not in GPU_CHOICES or global_batch not in BATCH_CHOICES:
        raise ValueError(f"planner_explorer: gpus must be one of {GPU_CHOICES} and "
                         f"global_batch one of {BATCH_CHOICES}, got {gpus}, {global_batch}")
    return PlannerExplorer(model=model, cluster_name=cluster_name, gpus=gpus,
                           global_batch=global_batch)
