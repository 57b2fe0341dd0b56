"""A measured GPU beside the datasheets (lessons 06 and 09): results folders found and read,
roofs, peaks, MFU and copies, from synthetic device.json files that `save_device_figures`
writes into a temporary folder (made-up round numbers, never shipped as a measurement)."""

from __future__ import annotations

import json
import math

import pytest

from toolkit.cost.offload import iteration_time
from toolkit.cost.results import save_device_figures
from toolkit.flops import A100_TF32, H100_SXM_BF16, H100_SXM_FP32
from toolkit.models import GPTConfig
from toolkit.roofline import A100_SXM, H100_SXM, Roof, gpt_block_kernels, mfu_bound
from toolkit.viz.measured_device import (
    COPY_LABELS, DTYPE_DASH, NO_DEVICE, copy_bars, datasheet_peak, measured_devices,
    measured_roofline_figure, measured_roofs, mfu_rows, offload_link, peak_rows,
)
from toolkit.viz.offload import bandwidth_bars

N = 8192
TFLOPS = {"fp32": 50.0, "tf32": 250.0, "bf16": 500.0, "fp16": 500.0}  # synthetic
GBS = {("h2d", "pinned"): 50.0, ("d2h", "pinned"): 40.0, ("h2d", "pageable"): 20.0,
       ("d2h", "pageable"): 5.0, ("d2d", "device"): 2000.0}           # synthetic
CFG = GPTConfig(vocab_size=256, seq_len=16, d_model=256, n_head=4, n_layer=2)


def write_gpu(folder, name="NVIDIA H100 80GB HBM3"):
    """A device.json in gpu_figures.py's format, with the synthetic numbers above."""
    flops = 2 * N**3
    matmul = [{"dtype": d, "n": N, "flops": flops, "seconds": flops / (t * 1e12), "tflops": t}
              for d, t in TFLOPS.items()]
    copies = [{"kind": k, "memory": m, "bytes": 1 << 30, "seconds": (1 << 30) / (g * 1e9),
               "gb_per_s": g} for (k, m), g in GBS.items()]
    return save_device_figures({"name": name, "memory_bytes": 80 << 30, "matmul": matmul,
                                "copies": copies, "meta": {"torch": "2.x+cu", "date": "d"}},
                               folder)


def write_rehearsal(folder):
    """What `gpu_figures.py --device cpu` writes: fp32 and bf16 matmuls and a host copy."""
    return save_device_figures({"name": "cpu", "matmul": [
        {"dtype": "fp32", "n": 256, "flops": 2 * 256**3, "seconds": 1e-3, "tflops": 0.03}],
        "copies": [{"kind": "h2h", "memory": "pageable", "bytes": 8 << 20, "seconds": 1e-3,
                    "gb_per_s": 8.4}], "meta": {}}, folder)


@pytest.fixture
def results(tmp_path):
    write_gpu(tmp_path / "results" / "gpu-a")
    write_rehearsal(tmp_path / "results" / "rehearsal")
    return tmp_path / "results"


def test_found_folders_skip_rehearsals_and_say_what_was_read(results, tmp_path):
    devices, line = measured_devices(tmp_path / "runs", results)  # the first root is absent
    assert list(devices) == ["NVIDIA H100 80GB HBM3"]
    assert line.startswith("Measured GPUs: gpu-a (NVIDIA H100 80GB HBM3, torch 2.x+cu, d)")
    assert "skipped rehearsal: CPU rehearsals" in line and "\n" not in line
    write_gpu(results / "gpu-b")  # the same GPU model on another node: told apart by folder
    devices, _ = measured_devices(results)
    assert list(devices) == ["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3 (gpu-b)"]


def test_without_a_folder_one_line_says_how_to_get_one(tmp_path):
    devices, line = measured_devices(tmp_path / "runs", tmp_path / "results")
    assert devices == {} and "\n" not in line
    assert line == NO_DEVICE.format(roots=f"{tmp_path / 'runs'} or {tmp_path / 'results'}")
    assert "make gpu-check" in line and "results/gpu-HOST/" in line


@pytest.mark.parametrize("name, dtype, peak", [
    ("NVIDIA H100 80GB HBM3", "bf16", H100_SXM_BF16),
    ("NVIDIA H100 80GB HBM3", "fp16", H100_SXM_BF16),
    ("NVIDIA H100 80GB HBM3", "fp32", H100_SXM_FP32),
    ("NVIDIA A100-SXM4-80GB", "tf32", A100_TF32),
    ("NVIDIA H100 PCIe", "fp32", None), ("NVIDIA H200", "bf16", 989e12),
    ("NVIDIA L4", "bf16", None)])
def test_datasheet_peaks_match_the_device_name_or_nothing(name, dtype, peak):
    assert datasheet_peak(name, dtype) == peak


def test_one_roof_per_dtype_with_the_device_copy_as_slope(results):
    devices, _ = measured_devices(results)
    roofs = measured_roofs(devices["NVIDIA H100 80GB HBM3"], label="x")
    assert list(roofs) == list(TFLOPS)
    assert roofs["bf16"] == Roof("x bf16, measured", 500e12, 2000e9)
    assert roofs["fp32"].ridge == pytest.approx(50e12 / 2000e9)
    rows = {r["dtype"]: r for r in peak_rows(devices["NVIDIA H100 80GB HBM3"])}
    assert rows["bf16"]["measured / datasheet"] == pytest.approx(500e12 / H100_SXM_BF16)
    assert rows["fp32"]["datasheet TFLOP/s"] == pytest.approx(H100_SXM_FP32 / 1e12)
    assert rows["tf32"]["n"] == N


def test_roofline_figure_draws_measured_roofs_beside_the_datasheets(results):
    devices, _ = measured_devices(results)
    here = Roof("here", 5e10, 1e10)
    fig = measured_roofline_figure(devices, [here, A100_SXM, H100_SXM])
    names = [t.name for t in fig.data if t.mode == "lines"]
    assert names[:3] == ["here", A100_SXM.name, H100_SXM.name]
    assert names[3:] == [f"NVIDIA H100 80GB HBM3 {d}, measured" for d in TFLOPS]
    for dtype in TFLOPS:
        line = next(t for t in fig.data if t.name == f"NVIDIA H100 80GB HBM3 {dtype}, measured")
        assert line.line.dash == DTYPE_DASH[dtype] and max(line.y) == pytest.approx(
            TFLOPS[dtype] * 1e12)
        ridge = next(t for t in fig.data if t.legendgroup == line.name and t.mode == "markers")
        assert list(ridge.x) == [pytest.approx(TFLOPS[dtype] * 1e12 / 2000e9)]
    assert len({t.line.color for t in fig.data if "measured" in str(t.legendgroup)}) == 1
    json.dumps(fig.to_plotly_json(), default=str)
    only = measured_roofline_figure({}, [here])  # no folder: the roofs there are
    assert [t.name for t in only.data if t.mode == "lines"] == ["here"]
    with pytest.raises(ValueError, match="at least one Roof"):
        measured_roofline_figure({}, [])


def test_mfu_against_the_measured_peak_and_the_datasheet(results):
    write_gpu(results / "gpu-z", name="Example GPU")  # no datasheet: one row only
    devices, _ = measured_devices(results)
    kernels = gpt_block_kernels(CFG, 16, bytes_per_element=2)
    rows = mfu_rows(devices, kernels, model_flops=1e9)
    assert [r["peak divided by"] for r in rows] == [
        "measured bf16 matmul, 500 TFLOP/s", "datasheet bf16 dense, 989 TFLOP/s",
        "measured bf16 matmul, 500 TFLOP/s"]
    bound = mfu_bound(kernels, Roof("m", 500e12, 2000e9))
    assert rows[0]["MFU"] == pytest.approx(bound)
    assert rows[1]["MFU"] == pytest.approx(bound * 500e12 / H100_SXM_BF16)
    for r, peak in zip(rows, (500e12, H100_SXM_BF16, 500e12)):  # one step time, two peaks
        assert r["step (ms)"] == pytest.approx(1e3 * 1e9 / (r["MFU"] * peak))
    assert rows[2]["machine"] == "Example GPU, at its measured roofline bound"


def test_copies_as_bars_and_as_zero_offloads_link(results):
    devices, _ = measured_devices(results)
    rows = copy_bars(devices)
    assert [r[0] for r in rows] == [f"NVIDIA H100 80GB HBM3: {t}" for t in COPY_LABELS.values()]
    assert [r[1] for r in rows] == [GBS[k] * 1e9 for k in COPY_LABELS]
    fig = bandwidth_bars(rows)
    assert [t.name for t in fig.data] == ["measured by gpu-check: NVIDIA H100 80GB HBM3"]
    figures = devices["NVIDIA H100 80GB HBM3"]
    psi = 13e9  # 2Ψ down at 40 GB/s, 2Ψ up at 50 GB/s, one after the other
    pcie = iteration_time(psi, tokens=2048, params_tier="gpu", optimizer_tier="cpu",
                          peak_flops=1e14, pcie=offload_link(figures), host=5e10, nvme=3.5e9).pcie
    assert math.isclose(pcie, 2 * psi / 40e9 + 2 * psi / 50e9)
    assert offload_link(figures, memory="pageable") == pytest.approx(4 / (2 / 5e9 + 2 / 20e9))
