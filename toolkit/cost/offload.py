"""Time of offloading: an offloaded optimizer step chunk by chunk (α-β per tier), and the
efficiency of a whole offloaded iteration (ZeRO-Infinity's bandwidth analysis).

**One step of `toolkit.offload.OffloadOptimizer`.** Chunk k of n_k elements with s_in bytes of
state per element to read and s_out to write; each tier is an α-β link per direction (lesson 03:
a transfer of n bytes takes α + n·β), the update an α-β line in elements:

    read_k = c·α_r + s_in·n_k·β_r     update_k = α_u + n_k·β_u     write_k = c·α_w + s_out·n_k·β_w

with c the tensors moved per chunk (one transfer each: Adam's two states, plus master weights).

Without prefetch the step is Σ (read_k + update_k + write_k). With prefetch one I/O thread does
reads and writes first in, first out, in the optimizer's order (read 1, read 2, write 1, read 3,
write 2, ...) while the main thread updates; `step_time` replays that order exactly, so for
equal chunks the step is ≈ read + m·max(update, read + write) + write: bound by the I/O or by
the updates, whichever is slower, not by their sum.

**A whole iteration (ZeRO-Infinity, Rajbhandari et al., SC 2021, §4).** Per GPU, with batch b
and sequence s, an iteration computes 2·4·12·b·s·L·h² = 8·b·s·Ψ FLOPs (forward, backward and a
recomputed forward). Its arithmetic intensity (FLOPs per byte moved) is b·s for parameters and
gradients (8Ψ bytes: fp16 parameters loaded three times, gradients written once) and b·s/4 for
the optimizer states (32Ψ: 16 bytes per parameter read and written), and the efficiency with
bandwidth bw and peak throughput peak_tp is

    efficiency = ait·bw / (ait·bw + peak_tp)      (compute and transfer not overlapped)

Figure 3 and §4.2 read it at peak_tp = 70 TFLOP/s, s = 1024: over 70 GB/s keeps parameters and
gradients above 50 % efficiency at b = 1, and the optimizer states need ~1.5 TB/s for 90 % at
b = 2, far beyond PCIe; hence ZeRO-Offload updates on the CPU, where the states are (§3 of
Ren et al., USENIX ATC 2021: 4Ψ cross PCIe per step instead).

Published link speeds (`PUBLISHED`) carry their sources. Pure functions: numbers in, numbers out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..arguments import check_int, check_positive
from .models import AlphaBeta


@dataclass(frozen=True)
class Span:
    """One piece of work in an offloaded step: measured (`toolkit.offload`) or modelled."""

    lane: str
    """``"main"`` (the thread that steps) or ``"io"`` (the prefetching thread)."""
    kind: str
    """``"read"``, ``"update"``, ``"write"``, or ``"wait"`` (main thread waiting for a read)."""
    chunk: int
    start: float
    """Seconds (`time.perf_counter()` when measured, from 0 when modelled)."""
    end: float


@dataclass(frozen=True)
class TierLink:
    """A tier as the device sees it: the α-β line of reading from it and of writing to it."""

    name: str
    read: AlphaBeta
    write: AlphaBeta


@dataclass(frozen=True)
class StepTime:
    """A modelled step: total seconds, the time of each kind of work, and every span."""

    seconds: float
    read: float
    update: float
    write: float
    spans: list[Span]


def _time(link: AlphaBeta, amount: float, calls: int = 1) -> float:
    return calls * link.alpha + amount * link.beta if amount > 0 else 0.0


def step_time(chunks: Sequence[int], *, tier: TierLink, update: AlphaBeta, read_bytes: float,
              write_bytes: float, tensors: int = 1, prefetch: bool = True) -> StepTime:
    """Seconds of one offloaded step over `chunks` (elements per chunk), reading `read_bytes`
    and writing `write_bytes` of state per element (0 reads on a first step) in `tensors`
    transfers per chunk each way, the update taking `update.alpha + n·update.beta` per chunk of
    n elements (module docstring)."""
    for n in chunks:
        check_int("step_time", "chunks[i]", n)
    check_int("step_time", "tensors", tensors)
    if read_bytes < 0 or write_bytes < 0:
        raise ValueError(f"step_time: read_bytes and write_bytes must be >= 0 bytes per element, "
                         f"got {read_bytes!r}, {write_bytes!r}")
    r = [_time(tier.read, read_bytes * n, tensors) for n in chunks]
    u = [_time(update, n) for n in chunks]
    w = [_time(tier.write, write_bytes * n, tensors) for n in chunks]
    spans: list[Span] = []
    if not prefetch or len(chunks) < 2:
        t = 0.0
        for k in range(len(chunks)):
            for kind, d in (("read", r[k]), ("update", u[k]), ("write", w[k])):
                spans.append(Span("main", kind, k, t, t + d))
                t += d
        return StepTime(t, sum(r), sum(u), sum(w), spans)
    io_free = 0.0
    ends: dict[int, float] = {}

    def io(kind: str, k: int, submitted: float, seconds: float) -> float:
        nonlocal io_free
        start = max(submitted, io_free)
        io_free = start + seconds
        spans.append(Span("io", kind, k, start, io_free))
        return io_free

    ends[0] = io("read", 0, 0.0, r[0])
    main = 0.0
    for k in range(len(chunks)):
        if k + 1 < len(chunks):  # queued behind chunk k-1's write, as the optimizer does
            ends[k + 1] = io("read", k + 1, main, r[k + 1])
        if ends[k] > main:
            spans.append(Span("main", "wait", k, main, ends[k]))
        start = max(main, ends[k])
        main = start + u[k]
        spans.append(Span("main", "update", k, start, main))
        io("write", k, main, w[k])
    return StepTime(max(main, io_free), sum(r), sum(u), sum(w), spans)


def step_bytes(numel: int, *, state_bytes: float, master_bytes: float = 0,
               first: bool = False) -> tuple[float, float]:
    """(bytes read, bytes written) by one offloaded step over `numel` elements with
    `state_bytes` of optimizer state per element (fp32 Adam 8, SGD with momentum 4) and
    `master_bytes` of master weights (4 with fp32 masters): each state is read and written once;
    the `first` step reads only the master weights (the optimizer makes its states then)."""
    check_int("step_bytes", "numel", numel, low=0)
    if state_bytes < 0 or master_bytes < 0:
        raise ValueError(f"step_bytes: state_bytes and master_bytes must be >= 0, got "
                         f"{state_bytes!r}, {master_bytes!r}")
    read = numel * (master_bytes + (0 if first else state_bytes))
    return read, numel * (master_bytes + state_bytes)


def iteration_flops(num_params: float, tokens: float) -> float:
    """8·Ψ·tokens: forward 2, backward 4 and a recomputed forward 2 FLOPs per parameter and
    token (ZeRO-Infinity §4.1, 2·4·12·b·s·L·h² with Ψ = 12·L·h²)."""
    return 8.0 * num_params * tokens


INTENSITY_DIVISOR = {"params_grads": 1.0, "optimizer": 4.0}
"""ZeRO-Infinity §4.1: arithmetic intensity = b·s / divisor (bytes moved 8Ψ and 32Ψ)."""
BYTES_MOVED = {"params_grads": 8.0, "optimizer": 32.0}
"""Bytes moved per parameter per iteration (ZeRO-Infinity §4.1; product with the intensity is
the 8·b·s FLOPs per parameter)."""


def arithmetic_intensity(kind: str, *, tokens: float) -> float:
    """FLOPs per byte moved for `kind` ("params_grads" or "optimizer") at `tokens` = b·s."""
    if kind not in INTENSITY_DIVISOR:
        raise ValueError(f"arithmetic_intensity: kind must be one of {list(INTENSITY_DIVISOR)}, "
                         f"got {kind!r}")
    check_positive("arithmetic_intensity", "tokens", tokens)
    return tokens / INTENSITY_DIVISOR[kind]


def efficiency(ait: float, bandwidth: float, peak_flops: float) -> float:
    """ZeRO-Infinity §4.1: ait·bw / (ait·bw + peak_tp), compute and transfer in sequence."""
    check_positive("efficiency", "ait", ait)
    check_positive("efficiency", "peak_flops", peak_flops)
    if not bandwidth >= 0:
        raise ValueError(f"efficiency: bandwidth must be >= 0 bytes/s, got {bandwidth!r}")
    return ait * bandwidth / (ait * bandwidth + peak_flops)


def bandwidth_needed(target: float, ait: float, peak_flops: float) -> float:
    """The bandwidth at which `efficiency` reaches `target` (0 < target < 1)."""
    if not 0 < target < 1:
        raise ValueError(f"bandwidth_needed: target must be in (0, 1), got {target!r}")
    return target * peak_flops / (ait * (1 - target))


@dataclass(frozen=True)
class IterationTime:
    """Seconds per iteration on each resource of an offloaded GPU, and the step time when they
    run one after the other (the paper's efficiency) or all at once (perfect overlap)."""

    compute: float
    pcie: float
    host: float
    nvme: float

    @property
    def serial(self) -> float:
        return self.compute + self.pcie + self.host + self.nvme

    @property
    def overlapped(self) -> float:
        return max(self.compute, self.pcie, self.host, self.nvme)


TIER_NAMES = ("gpu", "cpu", "nvme")


def iteration_time(num_params: float, *, tokens: float, n_d: int = 1, params_tier: str = "gpu",
                   optimizer_tier: str = "gpu", peak_flops: float, pcie: float, host: float,
                   nvme: float) -> IterationTime:
    """One iteration of one GPU that holds `tokens` = b·s, with parameters (and gradients) in
    `params_tier` and optimizer states in `optimizer_tier`, each rank owning 1/`n_d` of them;
    bandwidths per GPU in bytes/s. Counts of ZeRO-Infinity §4.1 per parameter: 8 FLOPs per
    token; parameters and gradients 8 bytes (fp16, fetched three times, gradients once); the
    update reads and writes 32 bytes where the states live, on the CPU (ZeRO-Offload's CPU
    Adam; NVMe states stream through it). States off the GPU with parameters on it
    (ZeRO-Offload): 4 bytes cross PCIe (fp16 gradients down, parameters up)."""
    for name, tier in (("params_tier", params_tier), ("optimizer_tier", optimizer_tier)):
        if tier not in TIER_NAMES:
            raise ValueError(f"iteration_time: {name} must be one of {TIER_NAMES}, got {tier!r}")
    check_int("iteration_time", "n_d", n_d)
    for name, value in (("peak_flops", peak_flops), ("pcie", pcie), ("host", host),
                        ("nvme", nvme), ("tokens", tokens)):
        check_positive("iteration_time", name, value)
    share = num_params / n_d  # parameters whose states this rank keeps and updates
    pcie_bytes = nvme_bytes = host_bytes = 0.0
    if params_tier != "gpu":
        pcie_bytes += BYTES_MOVED["params_grads"] * share
    elif optimizer_tier != "gpu":
        pcie_bytes += 4 * share
    if params_tier == "nvme":
        nvme_bytes += BYTES_MOVED["params_grads"] * share
    if optimizer_tier != "gpu":
        host_bytes += BYTES_MOVED["optimizer"] * share
    if optimizer_tier == "nvme":
        nvme_bytes += BYTES_MOVED["optimizer"] * share
    return IterationTime(iteration_flops(num_params, tokens) / peak_flops, pcie_bytes / pcie,
                         host_bytes / host, nvme_bytes / nvme)


@dataclass(frozen=True)
class Published:
    """A published peak bandwidth and where it comes from."""

    link: str
    bytes_per_s: float
    source: str


PUBLISHED = (
    Published("H100 SXM HBM3", 3.35e12, "NVIDIA H100 Tensor Core GPU datasheet"),
    Published("A100 80GB SXM HBM2e", 2.039e12, "NVIDIA A100 Tensor Core GPU datasheet"),
    Published("V100 SXM2 HBM2", 900e9, "NVIDIA V100 Tensor Core GPU datasheet"),
    Published("NVLink 4 (H100, all links, both ways)", 900e9, "NVIDIA H100 datasheet"),
    Published("NVLink-C2C (Grace Hopper, CPU ↔ GPU, one way)", 450e9,
              "NVIDIA GH200 Grace Hopper Superchip datasheet: 900 GB/s both ways"),
    Published("PCIe 5.0 x16, one way", 63.0e9, "PCI-SIG: 32 GT/s × 16 lanes, 128b/130b"),
    Published("PCIe 4.0 x16, one way", 31.5e9, "PCI-SIG: 16 GT/s × 16 lanes, 128b/130b"),
    Published("PCIe 3.0 x16, one way", 15.75e9, "PCI-SIG: 8 GT/s × 16 lanes, 128b/130b"),
    Published("NVMe SSD, PCIe 4.0 x4, sequential read", 7.45e9,
              "Samsung 990 PRO datasheet (7,450 MB/s)"),
    Published("NVMe SSD, PCIe 4.0 x4, sequential write", 6.9e9,
              "Samsung 990 PRO datasheet (6,900 MB/s)"),
)
"""Peak link speeds, fastest first, each with its source (decimal GB/s)."""


__all__ = ["BYTES_MOVED", "INTENSITY_DIVISOR", "PUBLISHED", "TIER_NAMES", "IterationTime",
           "Published", "Span", "StepTime", "TierLink", "arithmetic_intensity",
           "bandwidth_needed", "efficiency", "iteration_flops", "iteration_time", "step_bytes",
           "step_time"]
