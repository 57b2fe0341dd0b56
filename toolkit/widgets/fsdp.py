"""The FSDP step explorer: units, world size and prefetch → a simulated step and its memory.

    from toolkit.widgets.fsdp import fsdp_explorer
    fsdp_explorer(psi=1e9, units=8, world_size=8)   # last line of a cell

A thin shell over `toolkit.data_parallel.fsdp_schedule.simulate_step` (α-β all-gathers and
reduce-scatters, compute from FLOPs): `fsdp_view` maps slider values to a figure and a sentence
and is tested without a browser; `FSDPExplorer` holds the sliders and redraws into an `Output`
(see `toolkit.widgets.cost` for the pattern).
"""

from __future__ import annotations

import math

import ipywidgets as W
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..cost import AlphaBeta, human_bytes
from ..formats import byte_unit
from ..data_parallel.fsdp_schedule import KINDS, StepSchedule, simulate_step
from .base import SliderExplorer

COLORS = {"all-gather": "#17becf", "reduce-scatter": "#e377c2", "forward": "#2ca02c",
          "backward": "#ff7f0e"}  # the collectives' hues match toolkit.viz.timeline's
ROWS = {"all-gather": "communication", "reduce-scatter": "communication",
        "forward": "compute", "backward": "compute"}
FLOPS_PER_PARAM_TOKEN = 2.0  # forward: one multiply-add per parameter per token (Kaplan 2020)


def step_inputs(*, psi: float, units: int, world_size: int, tokens: int, tflops: float,
                bytes_per_param: float = 2.0) -> tuple[float, float]:
    """(gathered bytes of one unit, forward seconds of one unit) for a model of `psi`
    parameters in `units` equal units, `tokens` tokens per rank per step at `tflops` TFLOP/s,
    parameters gathered at `bytes_per_param` bytes (bf16: 2)."""
    per_unit = psi / units
    return per_unit * bytes_per_param, FLOPS_PER_PARAM_TOKEN * per_unit * tokens / (tflops * 1e12)


def fsdp_view(*, psi: float, units: int, world_size: int, prefetch: bool,
              bandwidth_gbs: float, alpha_us: float = 10.0, tokens: int = 4096,
              tflops: float = 100.0) -> tuple[go.Figure, str, StepSchedule]:
    """What the explorer shows for these values: (figure, HTML verdict, the schedule).

    Top: one step on one rank, a row for communication and one for compute, a bar per unit's
    all-gather, forward, backward and reduce-scatter. Bottom: bytes of gathered parameters
    alive over the step, beside the shard bytes a rank always keeps.
    """
    if psi <= 0 or tokens <= 0 or tflops <= 0 or bandwidth_gbs <= 0:
        raise ValueError(f"fsdp_view: psi, tokens, tflops and bandwidth_gbs must be > 0, got "
                         f"{psi}, {tokens}, {tflops}, {bandwidth_gbs}")
    unit_bytes, forward_s = step_inputs(psi=psi, units=units, world_size=world_size,
                                        tokens=tokens, tflops=tflops)
    link = AlphaBeta(alpha=alpha_us * 1e-6, beta=1.0 / (bandwidth_gbs * 1e9))
    s = simulate_step(units=units, world_size=world_size, unit_bytes=unit_bytes,
                      forward_s=forward_s, link=link, prefetch=prefetch)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.55, 0.45],
                        vertical_spacing=0.08)
    ms = 1e3
    for kind in KINDS:
        ivs = [iv for iv in s.intervals if iv.kind == kind]
        fig.add_trace(go.Bar(
            name=kind, orientation="h", base=[iv.start * ms for iv in ivs],
            x=[max(iv.end - iv.start, s.step_time * 1e-3) * ms for iv in ivs],
            y=[ROWS[kind]] * len(ivs), text=[str(iv.unit) for iv in ivs],
            marker_color=COLORS[kind], textposition="inside", insidetextanchor="middle",
            hovertemplate=f"{kind} of unit %{{text}}<br>%{{base:.3f}} ms, %{{x:.3f}} ms long"
                          "<extra></extra>"), row=1, col=1)
    curve = s.gathered_bytes()
    # One IEC unit for the axis and the labels beside it (toolkit.formats), not raw bytes.
    unit, per = byte_unit(max([s.shard_bytes] + [b for _, b in curve]))
    fig.add_trace(go.Scatter(x=[t * ms for t, _ in curve], y=[b / per for _, b in curve],
                             mode="lines", line_shape="hv", name="gathered bytes alive",
                             line_color="#444"), row=2, col=1)
    fig.add_trace(go.Scatter(x=[0, s.step_time * ms], y=[s.shard_bytes / per] * 2, mode="lines",
                             name="shards kept (Ψ·bytes/p)", line=dict(dash="dash",
                                                                       color="#9467bd")),
                  row=2, col=1)
    fig.update_layout(barmode="overlay", height=430, margin=dict(l=110, r=20, t=50, b=40),
                      title=(f"One FSDP step: {units} units, p = {world_size}, "
                             f"prefetch {'on' if prefetch else 'off'}"))
    fig.update_yaxes(autorange="reversed", row=1, col=1)
    fig.update_yaxes(title_text=unit, row=2, col=1)
    fig.update_xaxes(title_text="time in the step (ms)", row=2, col=1)
    hidden = 1 - s.exposed_comm_time / s.comm_time if s.comm_time else 1.0
    verdict = (f"<b>step {s.step_time * ms:.3g} ms</b>: communication {s.comm_time * ms:.3g} ms, "
               f"{hidden:.0%} of it hidden behind compute. Gathered parameters peak at "
               f"<b>{human_bytes(s.peak_gathered_bytes)}</b> "
               f"({s.peak_gathered_bytes / unit_bytes:.0f} unit(s)) on top of "
               f"{human_bytes(s.shard_bytes)} of shards.")
    return fig, verdict, s


class FSDPExplorer(SliderExplorer):
    """Sliders for Ψ, units, world size, bandwidth and a prefetch toggle over `fsdp_view`.
    Attributes: the controls, and `SliderExplorer`'s `verdict`, `output`, `widget`, `figure`."""

    def __init__(self, *, psi: float, units: int, world_size: int, prefetch: bool,
                 bandwidth_gbs: float) -> None:
        slow = dict(continuous_update=False, style={"description_width": "90px"})
        super().__init__(
            self._view, rows=[["psi", "units", "world_size"], ["bandwidth_gbs", "prefetch"]],
            psi=W.FloatLogSlider(value=psi, base=10, min=7, max=11, step=0.1,
                                 readout_format=".2g", description="params Ψ", **slow),
            units=W.IntSlider(value=units, min=1, max=32, description="units", **slow),
            world_size=W.SelectionSlider(options=[2 ** k for k in range(1, 9)],
                                         value=world_size, description="ranks p", **slow),
            bandwidth_gbs=W.FloatLogSlider(value=bandwidth_gbs, base=10, min=0, max=3,
                                           step=0.05, readout_format=".3g",
                                           description="link GB/s", **slow),
            prefetch=W.Checkbox(value=prefetch, description="prefetch"))

    def _view(self, **values: float) -> tuple[go.Figure, str]:
        figure, verdict, _ = fsdp_view(**values)
        return figure, verdict


def fsdp_explorer(*, psi: float = 1e9, units: int = 8, world_size: int = 8,
                  prefetch: bool = False, bandwidth_gbs: float = 25.0) -> FSDPExplorer:
    """The explorer, ready to show (end a cell with it)."""
    if world_size not in [2 ** k for k in range(1, 9)]:
        world_size = 2 ** min(8, max(1, round(math.log2(max(world_size, 2)))))
    return FSDPExplorer(psi=psi, units=units, world_size=world_size, prefetch=prefetch,
                        bandwidth_gbs=bandwidth_gbs)


__all__ = ["FSDPExplorer", "fsdp_explorer", "fsdp_view", "step_inputs"]
