"""A GPU measured by `make gpu-check` beside the datasheets: its roofs, its peaks against the
vendor's, a step's MFU against both, and its copies beside the published links.

**Roofs** (Williams, Waterman & Patterson, "Roofline", CACM 2009; `toolkit.roofline`). A
measured device gives one roof per dtype, attainable(I) = min(P_dtype, I·W), with P_dtype the
matmul throughput `benchmarks/gpu_figures.py` measured (2n³ FLOPs over the median time of an
n × n × n matmul, n = 8192 on a GPU; fp32 with TF32 off, tf32, bf16, fp16) and W its
device-to-device copy bandwidth (bytes read + written, as STREAM's copy and the HBM figures of
datasheets count them). Both are what the GPU did, not what it is rated for: a large matmul
reaches a share of the datasheet peak (clock under load, power limit, the kernel torch picked),
a copy a share of the memory's rated bandwidth.

**MFU** (Chowdhery et al., "PaLM", 2022, appendix B) = model FLOPs ÷ step time ÷ peak. The same
step against two peaks: MFU_datasheet = MFU_measured · P_measured / P_datasheet, so the measured
matmul's own share of the datasheet peak, P_measured / P_datasheet, is about the most a step of
matmuls scores against the datasheet on that GPU (smaller matmuls and other kernels only lower
it; `mfu_rows`).

**Copies** (lesson 09's tiers): host → device and device → host of 1 GiB from pinned
(page-locked) and from pageable host memory. From pageable memory the driver first copies into
a pinned buffer of its own and DMAs from there (NVIDIA, Harris, "How to Optimize Data Transfers
in CUDA C/C++", 2012), so only pinned copies approach the link's rate.

Datasheet peaks come from `toolkit.flops.PEAK_FLOPS`, matched to torch's device name by
`DATASHEET_MODELS` (no match: no datasheet column, never a guess). `measured_devices` reads the
results folders (`toolkit.cost.results`); the rest are pure functions, data in, figure or rows
out.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Sequence

import plotly.graph_objects as go

from ..cost.results import DeviceFigures, find_device_figures, load_device_figures
from ..flops import PEAK_FLOPS
from ..roofline import Kernel, Roof, mfu_bound
from .roofline import roofline_figure

__all__ = ["COPY_LABELS", "DATASHEET_MODELS", "DTYPE_DASH", "NO_DEVICE", "copy_bars",
           "datasheet_peak", "measured_devices", "measured_roofline_figure", "measured_roofs",
           "mfu_rows", "offload_link", "peak_rows"]

DATASHEET_MODELS: tuple[tuple[str, str], ...] = (
    ("H100 PCIe", "H100 PCIe"), ("H100 80GB HBM3", "H100 SXM"), ("H100 SXM", "H100 SXM"),
    ("H200", "H200"), ("A100", "A100"))
"""(part of torch's device name, model in `toolkit.flops.PEAK_FLOPS`), first match wins. torch
names an H100 SXM "NVIDIA H100 80GB HBM3"; every A100 has the same tensor-core peaks."""

DTYPE_DASH = {"fp32": "dot", "tf32": "dashdot", "bf16": "solid", "fp16": "dash"}
"""Line style of a measured roof per matmul dtype."""

COPY_LABELS = {("h2d", "pinned"): "host → device, pinned",
               ("h2d", "pageable"): "host → device, pageable",
               ("d2h", "pinned"): "device → host, pinned",
               ("d2h", "pageable"): "device → host, pageable",
               ("d2d", "device"): "device → device (read + write)"}
"""The copies `benchmarks/gpu_figures.py` times on a GPU, as the figures name them."""

_DEVICE_COLORS = ("#ff7f0e", "#e377c2", "#17becf", "#bcbd22")
NO_DEVICE = ("No measured GPU: no GPU's device.json under {roots}. Run `make gpu-check` on a "
             "GPU node and copy its results/gpu-HOST/ folder into the results/ folder beside "
             "lessons/ to draw it beside the datasheets.")
"""The line `measured_devices` gives when it finds no GPU: what is missing, how to get it."""


def _is_gpu(figures: DeviceFigures) -> bool:
    """A GPU's figures, not a CPU rehearsal's (`gpu_figures.py --device cpu` times no d2d)."""
    copies = figures.copies
    return figures.name != "cpu" and bool(((copies.kind == "d2d")
                                           & (copies.memory == "device")).any())


def measured_devices(*roots: str | os.PathLike) -> tuple[dict[str, DeviceFigures], str]:
    """The GPUs measured in the results folders directly under `roots` (those holding a
    device.json), labelled by device name (and folder, when two share a name), and one line
    saying what was found, or, when nothing was, how to get a measurement. CPU rehearsals are
    skipped, and the line says so."""
    found: dict[str, DeviceFigures] = {}
    used, skipped = [], []
    for folder in find_device_figures(*roots):
        figures = load_device_figures(folder)
        if not _is_gpu(figures):
            skipped.append(Path(folder).name)
            continue
        label = figures.name if figures.name not in found else f"{figures.name} ({folder.name})"
        found[label] = figures
        meta = figures.info.get("meta", {})
        used.append(f"{Path(folder).name} ({figures.name}, torch {meta.get('torch', '?')}, "
                    f"{meta.get('date', 'undated')})")
    line = ("Measured GPUs: " + "; ".join(used) if used
            else NO_DEVICE.format(roots=" or ".join(str(r) for r in roots)))
    if skipped:
        line += f" (skipped {', '.join(skipped)}: CPU rehearsals, no GPU figures)"
    return found, line


def datasheet_peak(device_name: str, dtype: str) -> float | None:
    """The datasheet's dense matmul peak (FLOP/s) of the GPU torch calls `device_name` for
    `dtype` (fp32, tf32, bf16, fp16), or None when `DATASHEET_MODELS` or `PEAK_FLOPS` has
    none. fp16 reads the bf16 row: A100 and H100 datasheets give both the same dense peak."""
    model = next((m for part, m in DATASHEET_MODELS if part in device_name), None)
    if model is None:
        return None
    return PEAK_FLOPS.get(f"{model} {'bf16' if dtype == 'fp16' else dtype}")


def measured_roofs(figures: DeviceFigures, *, label: str | None = None) -> dict[str, Roof]:
    """One `Roof` per measured matmul dtype: its TFLOP/s as the roof, the device-to-device copy
    bandwidth as the slope; named "LABEL DTYPE, measured" (LABEL defaults to the device)."""
    bandwidth = figures.bandwidth("d2d", "device") * 1e9
    return {dtype: Roof(f"{label or figures.name} {dtype}, measured",
                        figures.peak_tflops(dtype) * 1e12, bandwidth)
            for dtype in figures.matmul.dtype}


def peak_rows(figures: DeviceFigures) -> list[dict]:
    """Per matmul dtype: n, the measured TFLOP/s, the datasheet's (None when unknown) and the
    measured share of it; then the device-to-device bandwidth (GB/s)."""
    rows = []
    for r in figures.matmul.itertuples():
        sheet = datasheet_peak(figures.name, r.dtype)
        rows.append({"dtype": r.dtype, "n": int(r.n), "measured TFLOP/s": float(r.tflops),
                     "datasheet TFLOP/s": None if sheet is None else sheet / 1e12,
                     "measured / datasheet": None if sheet is None else r.tflops * 1e12 / sheet})
    return rows


def measured_roofline_figure(devices: Mapping[str, DeviceFigures], roofs: Sequence[Roof], *,
                             title: str = "measured GPU roofs beside the datasheets",
                             intensity_range: tuple[float, float] = (0.1, 1e3)) -> go.Figure:
    """`roofs` (this machine's, the datasheets') and each measured device's roofs, one per
    dtype (`measured_roofs`), a colour per device and a line style per dtype (`DTYPE_DASH`)."""
    if not roofs and not devices:
        raise ValueError("measured_roofline_figure: pass at least one Roof or measured device")
    measured = [(i, dtype, roof) for i, (label, figures) in enumerate(devices.items())
                for dtype, roof in measured_roofs(figures, label=label).items()]
    fig = roofline_figure([*roofs, *(roof for _, _, roof in measured)], title=title,
                          intensity_range=intensity_range)
    for i, dtype, roof in measured:
        color = _DEVICE_COLORS[i % len(_DEVICE_COLORS)]
        fig.update_traces(selector=dict(legendgroup=roof.name),
                          line=dict(color=color, dash=DTYPE_DASH.get(dtype, "solid")),
                          marker=dict(color=color))
    return fig


def mfu_rows(devices: Mapping[str, DeviceFigures], kernels: Sequence[Kernel], *,
             model_flops: float, dtype: str = "bf16") -> list[dict]:
    """For each measured device, the step of `model_flops` at the fastest time its measured
    `dtype` roof allows `kernels` (`toolkit.roofline.mfu_bound`): its MFU against the measured
    matmul peak, and against the datasheet's where one is known. Rows: machine, step (ms),
    MFU, peak divided by."""
    rows = []
    for label, figures in devices.items():
        roof = measured_roofs(figures, label=label)[dtype]
        bound = mfu_bound(kernels, roof)
        seconds = model_flops / (bound * roof.peak_flops)
        where = f"{label}, at its measured roofline bound"
        rows.append({"machine": where, "step (ms)": 1e3 * seconds, "MFU": bound,
                     "peak divided by": f"measured {dtype} matmul, "
                                        f"{roof.peak_flops / 1e12:.0f} TFLOP/s"})
        sheet = datasheet_peak(figures.name, dtype)
        if sheet is not None:
            rows.append({"machine": where, "step (ms)": 1e3 * seconds,
                         "MFU": bound * roof.peak_flops / sheet,
                         "peak divided by": f"datasheet {dtype} dense, {sheet / 1e12:.0f} TFLOP/s"})
    return rows


def copy_bars(devices: Mapping[str, DeviceFigures]) -> list[tuple[str, float, str]]:
    """`toolkit.viz.offload.bandwidth_bars` rows (label, bytes/s, group) of each device's
    measured copies (`COPY_LABELS`, those it has), one group per device."""
    rows = []
    for label, figures in devices.items():
        for (kind, memory), text in COPY_LABELS.items():
            hit = figures.copies[(figures.copies.kind == kind) & (figures.copies.memory == memory)]
            if not hit.empty:
                rows.append((f"{label}: {text}", float(hit.gb_per_s.iloc[0]) * 1e9,
                             f"measured by gpu-check: {label}"))
    return rows


def offload_link(figures: DeviceFigures, *, memory: str = "pinned") -> float:
    """Bytes/s of ZeRO-Offload's per-step PCIe traffic over the measured copies: 2Ψ of fp16
    gradients device → host and 2Ψ of fp16 parameters host → device (Ren et al., ATC 2021, §3)
    in turn, 4Ψ / (2Ψ/d2h + 2Ψ/h2d): the harmonic mean, the one rate for
    `toolkit.cost.offload.iteration_time`'s `pcie`."""
    h2d, d2h = (figures.bandwidth(kind, memory) * 1e9 for kind in ("h2d", "d2h"))
    return 4 / (2 / d2h + 2 / h2d)
