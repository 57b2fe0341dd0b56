"""Lesson 15's explorers: how often to synchronise (local SGD's H on an α-β link), and how much
to compress (PowerSGD's rank r on a real gradient).

    local_sgd_explorer(curves)            # curves: H -> recorded loss per step (H = 1: DDP)
    powersgd_explorer(matrices)           # matrices: name -> a gradient as an n × m matrix

`local_sgd_view` sets the recorded loss curves on a time axis: a step costs the compute time
plus the ring all-reduce of 4Ψ bytes over p ranks (`toolkit.cost.traffic.sync_time_per_step`),
paid once every H steps; nothing overlaps, so DDP's step is an upper bound. It assumes the
loss per step of the small recorded run carries over to a model of Ψ parameters: a what-if,
not a prediction. `powersgd_view` compresses one matrix with one and with four power steps
(`toolkit.data_parallel.powersgd.power_step`) and sets the error beside the best rank-r
approximation (the SVD's, Eckart–Young) and the bytes r·(n + m) beside n·m. Both views are
pure and tested without a browser; the explorers are `SliderExplorer`s.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import ipywidgets as W
import plotly.graph_objects as go
import torch
from torch import Tensor

from ..cost import AlphaBeta, human_bytes
from ..cost.traffic import compresses, sync_time_per_step
from ..data_parallel.powersgd import power_step
from ..viz.communicating_less import loss_vs_time, rank_tradeoff
from .base import SLOW, SliderExplorer

__all__ = ["local_sgd_explorer", "local_sgd_view", "powersgd_explorer", "powersgd_errors",
           "powersgd_view", "smoothed", "time_to_reach"]


def smoothed(losses: Sequence[float], window: int = 8) -> list[float]:
    """Mean of the last ``window`` values at each step (fewer at the start)."""
    out, total = [], 0.0
    for i, v in enumerate(losses):
        total += v
        if i >= window:
            total -= losses[i - window]
        out.append(total / min(i + 1, window))
    return out


def time_to_reach(losses: Sequence[float], target: float, seconds_per_step: float) -> float:
    """Seconds until the `smoothed` loss first reaches ``target`` (inf: never in the run)."""
    for i, v in enumerate(smoothed(losses)):
        if v <= target:
            return (i + 1) * seconds_per_step
    return math.inf


def local_sgd_view(curves: Mapping[int, Sequence[float]], *, sync_every: int, params: float,
                   world_size: int, alpha_us: float, bandwidth_gbs: float, compute_ms: float,
                   bytes_per_param: int = 4) -> tuple[go.Figure, str]:
    """(figure, verdict) for local SGD with H = ``sync_every`` against DDP (``curves[1]``)."""
    if 1 not in curves or sync_every not in curves:
        raise ValueError(f"local_sgd_view: curves needs H = 1 (DDP) and H = {sync_every}, "
                         f"has {sorted(curves)}")
    if params <= 0 or bandwidth_gbs <= 0 or compute_ms < 0 or alpha_us < 0:
        raise ValueError("local_sgd_view: params and bandwidth_gbs must be > 0, compute_ms and "
                         f"alpha_us >= 0; got {params}, {bandwidth_gbs}, {compute_ms}, {alpha_us}")
    link = AlphaBeta(alpha=alpha_us * 1e-6, beta=1.0 / (bandwidth_gbs * 1e9))
    nbytes = params * bytes_per_param
    sync = sync_time_per_step(nbytes, world_size, link)            # one all-reduce, seconds
    step = {1: compute_ms * 1e-3 + sync, sync_every: compute_ms * 1e-3 + sync / sync_every}
    names = {1: "DDP (H = 1)", sync_every: f"local SGD, H = {sync_every}"}
    shown = {names[h]: smoothed(curves[h]) for h in (1, sync_every)}
    final = {h: shown[names[h]][-1] for h in (1, sync_every)}
    target = max(final.values())          # a loss both runs reach
    fig = loss_vs_time(shown, {names[h]: step[h] for h in (1, sync_every)}, target=target,
                       title=f"{human_bytes(nbytes)} all-reduced over {world_size} ranks "
                             f"at {bandwidth_gbs:g} GB/s")
    reach = {h: time_to_reach(curves[h], target, step[h]) for h in (1, sync_every)}
    first = "DDP" if reach[1] <= reach[sync_every] else f"H = {sync_every}"
    html = (f"all-reduce {sync * 1e3:.3g} ms: DDP pays it every step ({step[1] * 1e3:.3g} ms per "
            f"step), H = {sync_every} once every {sync_every} steps "
            f"({step[sync_every] * 1e3:.3g} ms per step, {step[1] / step[sync_every]:.2f}× "
            f"faster). After {len(curves[1])} steps the loss is {final[sync_every]:.3g} against "
            f"DDP's {final[1]:.3g} ({final[sync_every] / final[1]:.2f}×). Both reach "
            f"{target:.3g} (dashed): DDP after {reach[1]:.3g} s, H = {sync_every} after "
            f"{reach[sync_every]:.3g} s: <b>{first} gets there first</b>.")
    return fig, html


def local_sgd_explorer(curves: Mapping[int, Sequence[float]], *, params: float = 1e9,
                       world_size: int = 64, alpha_us: float = 20.0,
                       bandwidth_gbs: float = 10.0, compute_ms: float = 500.0
                       ) -> SliderExplorer:
    """Sliders over `local_sgd_view`: H (the recorded ones), Ψ, p, α, bandwidth, compute."""
    hs = sorted(h for h in curves if h > 1)
    if not hs:
        raise ValueError("local_sgd_explorer: curves needs at least one H > 1 beside H = 1")

    def view(sync_every: int, log_params: float, world_size: int, alpha_us: float,
             log_bandwidth: float, compute_ms: float) -> tuple[go.Figure, str]:
        return local_sgd_view(curves, sync_every=sync_every, params=10**log_params,
                              world_size=world_size, alpha_us=alpha_us,
                              bandwidth_gbs=10**log_bandwidth, compute_ms=compute_ms)

    return SliderExplorer(
        view,
        sync_every=W.SelectionSlider(options=hs, value=hs[-1], description="H"),
        log_params=W.FloatSlider(value=math.log10(params), min=6, max=11, step=0.25,
                                 description="log₁₀ Ψ", **SLOW),
        world_size=W.SelectionSlider(options=[2, 8, 64, 512], value=world_size,
                                     description="ranks p"),
        alpha_us=W.FloatLogSlider(value=alpha_us, base=10, min=0, max=5, description="α (µs)",
                                  **SLOW),
        log_bandwidth=W.FloatSlider(value=math.log10(bandwidth_gbs), min=-2, max=3, step=0.25,
                                    description="log₁₀ GB/s", **SLOW),
        compute_ms=W.FloatLogSlider(value=compute_ms, base=10, min=0, max=4,
                                    description="compute (ms)", **SLOW),
        rows=[["sync_every", "log_params", "world_size"],
              ["alpha_us", "log_bandwidth", "compute_ms"]])


def powersgd_errors(matrix: Tensor, ranks: Sequence[int], *, seed: int = 0
                    ) -> dict[str, list[float]]:
    """Relative error ‖M − M̂‖/‖M‖ per rank r: one power step from a random Q, four (what
    warm start approaches if the gradient held still), and the best rank r (SVD)."""
    if matrix.dim() != 2:
        raise ValueError(f"powersgd_errors: matrix must be 2-D (n × m), got {tuple(matrix.shape)}")
    norm = matrix.norm().item()
    sigma = torch.linalg.svdvals(matrix)
    out: dict[str, list[float]] = {"1 power step": [], "4 power steps": [], "best rank r (SVD)": []}
    for r in ranks:
        gen = torch.Generator(device=matrix.device).manual_seed(seed)
        q = torch.randn(matrix.shape[1], r, generator=gen, device=matrix.device,
                        dtype=matrix.dtype)
        for steps, key in ((1, "1 power step"), (4, "4 power steps")):
            qk = q
            for _ in range(steps):
                p, qk = power_step(matrix, qk)
            out[key].append(((matrix - p @ qk.t()).norm() / norm).item())
        out["best rank r (SVD)"].append((sigma[r:].square().sum().sqrt() / norm).item())
    return out


def powersgd_view(matrices: Mapping[str, Tensor], *, layer: str, rank: int, max_rank: int = 8,
                  errors: Mapping[str, Sequence[float]] | None = None) -> tuple[go.Figure, str]:
    """(figure, verdict) for one gradient matrix at rank r; ``errors``: that layer's
    `powersgd_errors` for r = 1 … max_rank, when already computed."""
    if layer not in matrices:
        raise ValueError(f"powersgd_view: layer must be one of {list(matrices)}, got {layer!r}")
    if not 1 <= rank <= max_rank:
        raise ValueError(f"powersgd_view: rank must be in 1 … max_rank = {max_rank}, got {rank}")
    matrix = matrices[layer]
    n, m = matrix.shape
    ranks = list(range(1, max_rank + 1))
    if errors is None:
        errors = powersgd_errors(matrix, ranks)
    sent = [4 * r * (n + m) for r in ranks]
    fig = rank_tradeoff(ranks, errors, sent, dense_bytes=4 * n * m, chosen=rank,
                        title=f"{layer}: {n} × {m}")
    i = ranks.index(rank)
    worth = "compressed" if compresses(n, m, rank) else "<b>sent uncompressed</b>"
    html = (f"r = {rank}: {sent[i]:,} bytes instead of {4 * n * m:,} "
            f"({n * m / (rank * (n + m)):.1f}× less; {worth} under the rule "
            f"r·(n + m)·2 &lt; n·m); error after one power step {errors['1 power step'][i]:.1%}, "
            f"after four {errors['4 power steps'][i]:.1%}, best possible "
            f"{errors['best rank r (SVD)'][i]:.1%}")
    return fig, html


def powersgd_explorer(matrices: Mapping[str, Tensor], *, rank: int = 2,
                      max_rank: int = 8) -> SliderExplorer:
    """A layer menu and a rank slider over `powersgd_view`."""
    if not matrices:
        raise ValueError("powersgd_explorer: matrices is empty")

    computed: dict[str, dict[str, list[float]]] = {}   # layer -> errors: the rank slider
                                                        # only moves the marker

    def view(layer: str, rank: int) -> tuple[go.Figure, str]:
        if layer not in computed and layer in matrices:
            computed[layer] = powersgd_errors(matrices[layer], range(1, max_rank + 1))
        return powersgd_view(matrices, layer=layer, rank=rank, max_rank=max_rank,
                             errors=computed.get(layer))

    return SliderExplorer(view, layer=W.Dropdown(options=list(matrices), description="layer"),
                          rank=W.IntSlider(value=rank, min=1, max=max_rank, description="rank r"))
