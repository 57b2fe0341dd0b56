"""A DeepSpeed config explorer: the JSON a user writes, and what it does to each rank's bytes.

    from toolkit.widgets.frameworks import deepspeed_explorer
    deepspeed_explorer()   # last line of a cell: controls, the JSON and its cost, a figure

`deepspeed_view` writes the config JSON for the controls' values (`deepspeed_config`), reads it
back the way DeepSpeed would (`from_deepspeed`: the batch identity, the clipping default) and
draws the model-state bytes per device for ZeRO stages 0-3 of that config
(`layout_bytes` over `memory.model_state_bytes`), the chosen stage outlined; the verdict gives
the bytes moved off the device by offloading and the gradient bytes a rank sends per step by
the ZeRO paper's ring arithmetic. Tested without a browser; the explorer only wires controls.
"""

from __future__ import annotations

import html
import json

import ipywidgets as W
import plotly.graph_objects as go

from ..framework_settings import OFFLOAD_DEVICES, deepspeed_config, from_deepspeed, layout_bytes
from ..memory import GB, STAGES, GiB, model_state_bytes
from ..viz.memory import memory_bars
from .base import SliderExplorer

DP_CHOICES = (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
GPU_GIB = (24, 40, 80, 141)


def deepspeed_view(*, num_params: float = 7e9, dp: int = 8, stage: int = 2, bf16: bool = True,
                   offload: str = "none", micro_batch: int = 4, accumulation: int = 1,
                   gpu_gib: float = 80) -> tuple[go.Figure, str]:
    """(figure, HTML): bars of device bytes per ZeRO stage for this config, the chosen stage
    outlined; the JSON, the layout DeepSpeed reads from it, host bytes and bytes sent."""
    if stage not in STAGES:
        raise ValueError(f"deepspeed_view: stage must be one of {STAGES}, got {stage!r}")
    if offload not in OFFLOAD_DEVICES:
        raise ValueError(f"deepspeed_view: offload must be one of {OFFLOAD_DEVICES}, got "
                         f"{offload!r}")
    offload_here = offload if stage >= 1 else "none"  # ZeRO-Offload needs stage 1 or more
    config = deepspeed_config(micro_batch=micro_batch, accumulation=accumulation,
                              world_size=dp, stage=stage, bf16=bf16, clip=None,
                              offload_optimizer=offload_here)
    config.pop("zero_allow_untested_optimizer")
    config.pop("steps_per_print")
    config["optimizer"] = {"type": "AdamW", "params": {"lr": 3e-4}}
    layout = from_deepspeed(config, world_size=dp)
    bars = {}
    for s in STAGES:
        states = model_state_bytes(num_params, dp, s, layout.recipe)
        parts = {"params": states.params, "grads": states.grads, "optimizer": states.optimizer}
        if offload_here != "none" and s >= 1:
            parts["optimizer"] = 0.0   # on the host: see the verdict
        bars[f"stage {s}"] = parts
    cost = layout_bytes(layout, num_params=num_params)
    fig = memory_bars(bars, gpu_bytes=gpu_gib * GiB, highlight=f"stage {stage}",
                      title=f"model states per device: Ψ = {num_params / 1e9:.3g}B, d = {dp}, "
                            f"{layout.recipe.name}")
    note = (" (stage 0 cannot offload: offload_optimizer needs ZeRO stage 1 or more)"
            if offload != "none" and stage == 0 else "")
    verdict = (
        f"<pre>{html.escape(json.dumps(config, indent=1))}</pre>"
        f"DeepSpeed reads: B = {layout.micro_batch} × {layout.accumulation} × {layout.dp} = "
        f"{layout.global_batch} samples per step; gradient_clipping = {layout.clip:g} (left "
        f"out, so the default); {layout.recipe.name} "
        f"({layout.recipe.param_bytes:g} + {layout.recipe.grad_bytes:g} + "
        f"{layout.recipe.optimizer_bytes:g} bytes per parameter).<br>"
        f"Stage {stage}: <b>{cost.device / GB:.3g} GB</b> of model states on each device, "
        f"{cost.host / GB:.3g} GB on the host{note}; the ZeRO paper's ring sends "
        f"{cost.sent_per_step / GB:.3g} GB of gradients (and gathered parameters) per rank "
        f"per step. Activations come on top (lesson 07).")
    return fig, verdict


class DeepSpeedExplorer(SliderExplorer):
    """Controls over `deepspeed_view` (Ψ in billions)."""

    def __init__(self, *, num_params: float = 7e9, dp: int = 8, stage: int = 2) -> None:
        slow = dict(continuous_update=False, style={"description_width": "90px"})
        super().__init__(
            self._view, rows=[["stage", "offload"], ["dp", "num_params"],
                              ["bf16", "accumulation", "gpu_gib"]],
            stage=W.ToggleButtons(options=[(f"stage {s}", s) for s in STAGES], value=stage,
                                  description="ZeRO"),
            offload=W.ToggleButtons(options=list(OFFLOAD_DEVICES), value="none",
                                    description="optimizer"),
            dp=W.SelectionSlider(options=DP_CHOICES, value=dp, description="ranks d", **slow),
            num_params=W.FloatLogSlider(value=num_params / 1e9, base=10, min=-1, max=3,
                                        step=0.05, description="Ψ (billions)",
                                        readout_format=".3g", **slow),
            bf16=W.Checkbox(value=True, description="bf16.enabled"),
            accumulation=W.IntSlider(value=1, min=1, max=16, description="accumulation",
                                     **slow),
            gpu_gib=W.Dropdown(options=GPU_GIB, value=80, description="GPU (GiB)"))

    def _view(self, *, num_params: float, **rest: object) -> tuple[go.Figure, str]:
        return deepspeed_view(num_params=num_params * 1e9, **rest)  # type: ignore[arg-type]


def deepspeed_explorer(**kwargs: float) -> DeepSpeedExplorer:
    """A `DeepSpeedExplorer`, for the last line of a cell."""
    return DeepSpeedExplorer(**kwargs)  # type: ignore[arg-type]


__all__ = ["DeepSpeedExplorer", "deepspeed_explorer", "deepspeed_view"]
