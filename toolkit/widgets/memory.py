"""The memory calculator: a model (by name, or a bare parameter count), N_d, ZeRO stage,
precision recipe, sequence length, micro-batch and device memory, drawn as stacked bars per
stage with a verdict on whether the chosen configuration fits.

    from toolkit.widgets.memory import memory_explorer
    memory_explorer("gpt2-xl", n_d=8)   # last line of a cell: controls, a verdict, a figure

A thin shell over `toolkit.memory` (the numbers) and `toolkit.viz.memory.memory_bars` (the
figure): `memory_view` maps control values to (figure, verdict) and is tested without a browser;
`MemoryExplorer` only holds the controls and redraws into its `Output` area.
"""

from __future__ import annotations

import math

import ipywidgets as W
import plotly.graph_objects as go

from ..formats import human_bytes
from ..memory import MODELS, RECIPES, GiB, budget, model_shape, model_state_bytes
from ..memory.budget import Budget
from ..viz.memory import memory_bars
from .base import SliderExplorer

CUSTOM = "custom (Ψ only)"
"""Model choice that takes the parameter slider instead of a published shape."""
N_D_CHOICES = tuple(2 ** k for k in range(0, 11))
"""Data-parallel degrees offered: 1, 2, 4, … 1024."""
GPU_GIB = (16, 24, 32, 40, 48, 80, 96, 141)
"""Device memories offered, GiB (V100 16/32, A100 40/80, H100 80, H200 141, ...)."""
SEQ_CHOICES = (128, 256, 512, 1024, 2048, 4096, 8192)
"""Sequence lengths offered."""
_STAGE_NAMES = ("0: plain DP", "1: optimizer", "2: + gradients", "3: + parameters")


def memory_view(*, model: str, num_params: float = 1e9, n_d: int = 1, stage: int = 0,
                recipe: str = "mixed-precision Adam", seq_len: int | None = None,
                batch: int = 1, gpu_gib: float = 80, recompute: bool = False,
                ) -> tuple[go.Figure, str]:
    """What the calculator shows: (stacked bars for stages 0-3, HTML verdict for `stage`).

    `model` is a name in `toolkit.memory.MODELS` (activations from its shape, `seq_len`
    defaulting to the model's) or `CUSTOM`, where `num_params` sets Ψ and activations are left
    out (no shape to compute them from).
    """
    if recipe not in RECIPES:
        raise ValueError(f"memory_view: recipe must be one of {list(RECIPES)}, got {recipe!r}")
    if stage not in range(4):
        raise ValueError(f"memory_view: stage must be 0-3, got {stage!r}")
    gpu_bytes = gpu_gib * GiB
    budgets: dict[str, Budget] = {}
    for s in range(4):
        if model == CUSTOM:
            st = model_state_bytes(num_params, n_d, s, RECIPES[recipe])
            budgets[_STAGE_NAMES[s]] = Budget(st.params, st.grads, st.optimizer, 0.0, gpu_bytes)
        else:
            budgets[_STAGE_NAMES[s]] = budget(
                model, n_d=n_d, stage=s, recipe=RECIPES[recipe], batch=batch, seq_len=seq_len,
                gpu_bytes=gpu_bytes, recompute="full" if recompute else "none")
    psi = num_params if model == CUSTOM else model_shape(model).num_params
    what = f"Ψ = {psi / 1e9:.3g}B" if model == CUSTOM else f"{model} (Ψ = {psi / 1e9:.3g}B)"
    fig = memory_bars(budgets, gpu_bytes=gpu_bytes, highlight=_STAGE_NAMES[stage],
                      title=f"{what}, N_d = {n_d}, {recipe}")
    chosen = budgets[_STAGE_NAMES[stage]]
    # IEC units throughout (toolkit.formats), the unit the device's memory is given in.
    verdict = (f"<b>Stage {stage}</b>: {human_bytes(chosen.total)} per device "
               f"(model states {human_bytes(chosen.model_states)}, activations "
               f"{human_bytes(chosen.activations)}) on {human_bytes(gpu_bytes)}: ")
    verdict += ("<b style='color:#2ca02c'>fits</b>" if chosen.fits else
                "<b style='color:#d62728'>does not fit</b>")
    fitting = [s for s, b in enumerate(budgets.values()) if b.fits]
    verdict += (f". Lowest stage that fits: {fitting[0]}." if fitting else
                ". No stage fits: more ranks, recomputation or model parallelism needed.")
    if model == CUSTOM:
        verdict += " (Activations not counted: pick a named model for them.)"
    return fig, verdict


class MemoryExplorer(SliderExplorer):
    """Controls over `memory_view`. Attributes: the controls `model`, `num_params` (billions),
    `n_d`, `stage`, `recipe`, `seq_len`, `batch`, `gpu_gib`, `recompute`, and
    `SliderExplorer`'s `verdict`, `output`, `widget`, `figure`."""

    def __init__(self, *, model: str, num_params: float, n_d: int, stage: int, recipe: str,
                 seq_len: int, batch: int, gpu_gib: float) -> None:
        slow = dict(continuous_update=False, style={"description_width": "90px"})
        super().__init__(
            self._view,
            # N_d first: it changes the figure for every model (Ψ only counts for CUSTOM).
            rows=[["n_d", "stage"], ["model", "recipe"], ["seq_len", "batch"],
                  ["num_params", "gpu_gib", "recompute"]],
            model=W.Dropdown(options=[*MODELS, CUSTOM], value=model, description="model"),
            num_params=W.FloatLogSlider(value=num_params / 1e9, base=10, min=-2, max=3,
                                        step=0.05, description="Ψ (billions)",
                                        readout_format=".3g", **slow),
            n_d=W.SelectionSlider(options=N_D_CHOICES, value=n_d, description="N_d", **slow),
            stage=W.ToggleButtons(options=[(f"stage {s}", s) for s in range(4)], value=stage,
                                  description="stage"),
            recipe=W.Dropdown(options=list(RECIPES), value=recipe, description="precision"),
            seq_len=W.SelectionSlider(options=SEQ_CHOICES, value=seq_len,
                                      description="sequence", **slow),
            batch=W.IntSlider(value=batch, min=1, max=64, description="micro-batch", **slow),
            gpu_gib=W.Dropdown(options=GPU_GIB, value=gpu_gib, description="GPU (GiB)"),
            recompute=W.Checkbox(value=False, description="full recomputation"))

    def _view(self, *, model: str, num_params: float, **rest: object) -> tuple[go.Figure, str]:
        self.num_params.disabled = model != CUSTOM
        return memory_view(model=model, num_params=num_params * 1e9, **rest)


def memory_explorer(model: str = "gpt2-xl", *, num_params: float = 7.5e9, n_d: int = 8,
                    stage: int = 0, recipe: str = "mixed-precision Adam",
                    seq_len: int | None = None, batch: int = 1,
                    gpu_gib: float = 80) -> MemoryExplorer:
    """The memory calculator, starting from `model` (a name in `MODELS`, or `CUSTOM` with
    `num_params`). `n_d` snaps to the nearest power of two, `seq_len` (default the model's)
    to the nearest offered length, `gpu_gib` to the nearest offered size."""
    if model != CUSTOM:
        model_shape(model)  # a clear error for an unknown name
    seq = seq_len or (model_shape(model).seq_len if model != CUSTOM else 1024)
    nearest = lambda v, opts: min(opts, key=lambda o: abs(math.log(o) - math.log(v)))  # noqa
    return MemoryExplorer(model=model, num_params=num_params, n_d=nearest(n_d, N_D_CHOICES),
                          stage=stage, recipe=recipe, seq_len=nearest(seq, SEQ_CHOICES),
                          batch=batch, gpu_gib=nearest(gpu_gib, GPU_GIB))


__all__ = ["CUSTOM", "GPU_GIB", "N_D_CHOICES", "SEQ_CHOICES", "MemoryExplorer",
           "memory_explorer", "memory_view"]
