"""The offload explorer: where the model states live, the model's size and each tier's bandwidth
→ memory per tier against its capacity, and where an iteration's time goes.

    from toolkit.widgets.offload import offload_explorer
    offload_explorer("ZeRO-Offload", psi_b=13)   # last line of a cell

A thin shell over `toolkit.viz.offload.offload_view` (bytes from `toolkit.memory.offload`,
seconds from `toolkit.cost.offload.iteration_time`), which is tested without a browser;
`OffloadExplorer` only holds the controls (a `SliderExplorer`).
"""

from __future__ import annotations

import ipywidgets as W

from ..memory.offload import PLACEMENTS
from ..viz.offload import offload_view
from .base import SLOW, SliderExplorer

N_D_CHOICES = tuple(2 ** k for k in range(0, 11))
"""Data-parallel degrees offered: 1 … 1024."""
TOKEN_CHOICES = (512, 1024, 2048, 4096, 8192, 16384, 32768)
"""Tokens per GPU per iteration (micro-batch × sequence) offered."""
GPU_GIB = (16, 32, 40, 80, 141)
"""GPU memories offered, GiB (V100 16/32, A100 40/80, H100 80, H200 141)."""


class OffloadExplorer(SliderExplorer):
    """Controls over `offload_view`: `placement`, `psi_b`, `tokens`, `n_d`, `peak_tflops`,
    `pcie_gbs`, `host_gbs`, `nvme_gbs`, `gpu_gib`, `cpu_gib`, `nvme_tb`, `overlap`."""

    def __init__(self, *, placement: str, psi_b: float, tokens: int, n_d: int,
                 peak_tflops: float, pcie_gbs: float, host_gbs: float, nvme_gbs: float,
                 gpu_gib: float, cpu_gib: float, nvme_tb: float, overlap: bool) -> None:
        style = dict(style={"description_width": "110px"}, **SLOW)
        log = dict(base=10, step=0.05, readout_format=".3g", **style)
        super().__init__(
            offload_view,
            rows=[["placement", "psi_b", "n_d"], ["tokens", "peak_tflops", "overlap"],
                  ["pcie_gbs", "host_gbs", "nvme_gbs"], ["gpu_gib", "cpu_gib", "nvme_tb"]],
            placement=W.Dropdown(options=list(PLACEMENTS), value=placement,
                                 description="placement", style=style["style"]),
            psi_b=W.FloatLogSlider(value=psi_b, min=-1, max=4, description="Ψ (billions)",
                                   **log),
            n_d=W.SelectionSlider(options=N_D_CHOICES, value=n_d, description="N_d", **style),
            tokens=W.SelectionSlider(options=TOKEN_CHOICES, value=tokens,
                                     description="tokens per GPU", **style),
            peak_tflops=W.FloatLogSlider(value=peak_tflops, min=1, max=3.3,
                                         description="GPU TFLOP/s", **log),
            overlap=W.Checkbox(value=overlap, description="overlap transfers"),
            pcie_gbs=W.FloatLogSlider(value=pcie_gbs, min=0, max=2.5, description="PCIe GB/s",
                                      **log),
            host_gbs=W.FloatLogSlider(value=host_gbs, min=0.5, max=3,
                                      description="host memory GB/s", **log),
            nvme_gbs=W.FloatLogSlider(value=nvme_gbs, min=-1, max=1.5, description="NVMe GB/s",
                                      **log),
            gpu_gib=W.Dropdown(options=GPU_GIB, value=gpu_gib, description="GPU GiB",
                               style=style["style"]),
            cpu_gib=W.FloatLogSlider(value=cpu_gib, min=1, max=4, description="CPU GiB / GPU",
                                     **log),
            nvme_tb=W.FloatLogSlider(value=nvme_tb, min=-1, max=2, description="NVMe TB / GPU",
                                     **log))


def offload_explorer(placement: str = "ZeRO-Offload", *, psi_b: float = 13.0, tokens: int = 2048,
                     n_d: int = 1, peak_tflops: float = 100.0, pcie_gbs: float = 31.5,
                     host_gbs: float = 50.0, nvme_gbs: float = 3.5, gpu_gib: float = 80,
                     cpu_gib: float = 256.0, nvme_tb: float = 4.0,
                     overlap: bool = True) -> OffloadExplorer:
    """The explorer, starting from these values (bandwidths and capacities per GPU)."""
    if placement not in PLACEMENTS:
        raise ValueError(f"offload_explorer: placement must be one of {list(PLACEMENTS)}, "
                         f"got {placement!r}")
    return OffloadExplorer(placement=placement, psi_b=psi_b, tokens=tokens, n_d=n_d,
                           peak_tflops=peak_tflops, pcie_gbs=pcie_gbs, host_gbs=host_gbs,
                           nvme_gbs=nvme_gbs, gpu_gib=gpu_gib, cpu_gib=cpu_gib,
                           nvme_tb=nvme_tb, overlap=overlap)


__all__ = ["GPU_GIB", "N_D_CHOICES", "OffloadExplorer", "TOKEN_CHOICES", "offload_explorer"]
