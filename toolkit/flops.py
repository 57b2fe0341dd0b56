"""FLOPs of a transformer training step, and MFU / HFU: how much of the hardware a run uses.

Sources: Kaplan et al., 2020, "Scaling Laws for Neural Language Models" (arXiv:2001.08361),
section 2.1: C ≈ 6N FLOPs per token (2N forward, 4N backward); Chowdhery et al., 2022, "PaLM"
(arXiv:2204.02311), appendix B: model FLOPs per token 6N + 12·L·H·Q·T (H·Q = h, T = s), and MFU;
Korthikanti et al., 2022 (arXiv:2205.05198), section 6: hardware FLOPs utilisation (HFU) counts
the recomputed forward too.

Counting. A matmul (m, k) @ (k, n) costs 2·m·k·n FLOPs (a multiply and an add). Per token of a
forward pass, every weight matrix with N_w entries costs 2·N_w, so the weights cost 2N with N
the parameters *used in matmuls*: per layer q, k, v, out (4h²) and the MLP (2·h·d_ff), plus the
output head (h·V, also when tied to the embedding; lookups, biases and LayerNorms are not
matmuls and are left out, a fraction of a percent at scale). Attention adds q kᵀ and the
weighted sum of v: 2·s·h each per token per layer, 4·L·h·s. Backward does two matmuls for each
forward one (gradient of the input, of the weight), so a step costs 3× forward:

    per token:  6·N + 12·L·h·s          (PaLM appendix B; causal masking not subtracted)

`torch.utils.flop_counter.FlopCounterMode` counts the matmuls a step actually runs; for
`TinyGPT` it agrees with the formula exactly (`tests/test_flops.py`;
`toolkit.experiments.flops.measure_step` counts and times a real step, recomputation included).

Utilisation: MFU = model FLOPs per second ÷ peak; HFU = FLOPs the hardware did (recomputation
included) per second ÷ peak. Full activation recomputation reruns every layer's forward: 8N +
16·L·h·s per token of hardware work for the same model FLOPs. (PyTorch's non-reentrant
checkpoint stops rerunning a segment once every saved tensor is back, so it skips the segment's
last matmul: measured HFU work is a little below the formula.)
"""

from __future__ import annotations

import time
from typing import Callable

import torch
from torch import Tensor
from torch.utils.flop_counter import FlopCounterMode

from .arguments import check_int
from .models import GPTConfig

__all__ = ["A100_BF16", "A100_FP32", "A100_TF32", "H100_PCIE_BF16", "H100_SXM_BF16",
           "H100_SXM_FP32", "H100_SXM_FP8", "H100_SXM_TF32", "H200_BF16", "H200_FP32",
           "H200_FP8", "H200_TF32", "PEAK_FLOPS",
           "V100_FP16", "count_flops", "flash_recompute_flops", "flops_per_token", "hfu",
           "matmul_params", "matmul_peak", "mfu", "recompute_flops",
           "step_flops", "timed"]

# Peak dense tensor-core throughput, FLOP/s (vendor datasheets; "with sparsity" figures halved).
V100_FP16 = 125e12  # NVIDIA V100 SXM2 datasheet, fp16 tensor core
A100_BF16 = 312e12  # NVIDIA A100 datasheet, bf16 tensor core, dense (624e12 with sparsity)
H100_SXM_BF16 = 989e12  # NVIDIA H100 SXM datasheet, bf16 tensor core, dense (1979e12 sparse)
H100_PCIE_BF16 = 756e12  # NVIDIA H100 PCIe datasheet, bf16 dense (1513e12 sparse)
A100_FP32 = 19.5e12  # NVIDIA A100 datasheet, fp32 without tensor cores
# The "which peak" trap of fp32 runs (lesson 05): a datasheet's "TF32 Tensor Core" row is the
# tensor cores reading fp32 inputs rounded to 10 fraction bits; plain fp32 is the "FP32" row.
A100_TF32 = 156e12  # NVIDIA A100 datasheet, TF32 tensor core, dense (312e12 with sparsity)
H100_SXM_FP32 = 67e12  # NVIDIA H100 SXM datasheet, fp32 without tensor cores
H100_SXM_TF32 = 494.5e12  # NVIDIA H100 SXM datasheet, TF32 tensor core 989e12 with sparsity
H100_SXM_FP8 = 1979e12  # NVIDIA H100 SXM datasheet, fp8 tensor core, dense (3958e12 sparse)
# NVIDIA H200 (SXM) datasheet: the H100 SXM's compute with more and faster memory (141 GB HBM3e
# at 4.8 TB/s): FP32 67 TFLOPS; TF32 989, BF16 1,979 and FP8 3,958 TFLOPS "with sparsity",
# halved here to dense like every row above.
H200_FP32, H200_TF32, H200_BF16, H200_FP8 = 67e12, 494.5e12, 989e12, 1979e12

PEAK_FLOPS: dict[str, float] = {
    "V100 fp16": V100_FP16, "A100 bf16": A100_BF16, "A100 fp32": A100_FP32,
    "A100 tf32": A100_TF32, "H100 SXM bf16": H100_SXM_BF16, "H100 PCIe bf16": H100_PCIE_BF16,
    "H100 SXM fp32": H100_SXM_FP32, "H100 SXM tf32": H100_SXM_TF32, "H100 SXM fp8": H100_SXM_FP8,
    "H200 fp32": H200_FP32, "H200 tf32": H200_TF32, "H200 bf16": H200_BF16, "H200 fp8": H200_FP8,
}
"""Peak FLOP/s by accelerator and precision (dense; sources above)."""


def matmul_params(cfg: GPTConfig) -> int:
    """N: parameters that take part in matmuls, L·(4h² + 2·h·d_ff) + h·V (the head, even tied)."""
    h = cfg.d_model
    return cfg.n_layer * (4 * h * h + 2 * h * cfg.ff_dim) + h * cfg.vocab_size


def _seq(cfg: GPTConfig, seq_len: int | None) -> int:
    s = cfg.seq_len if seq_len is None else seq_len
    return check_int("", "seq_len", s)


def flops_per_token(cfg: GPTConfig, *, seq_len: int | None = None) -> float:
    """Training FLOPs per token, 6·N + 12·L·h·s (PaLM appendix B); s defaults to cfg.seq_len."""
    s = _seq(cfg, seq_len)
    return 6 * matmul_params(cfg) + 12 * cfg.n_layer * cfg.d_model * s


def recompute_flops(cfg: GPTConfig, *, seq_len: int | None = None,
                    recompute: str = "full") -> float:
    """Extra FLOPs per token that recomputation adds (they count in HFU, not in MFU).

    ``"none"``: 0. ``"full"``: every layer's forward again, 2·N_layers + 4·L·h·s.
    ``"selective"`` (Korthikanti et al., 2022, section 4.2): only the attention core
    (q kᵀ, softmax, ·v), 4·L·h·s.
    """
    s, h, L = _seq(cfg, seq_len), cfg.d_model, cfg.n_layer
    attention = 4 * L * h * s
    if recompute == "none":
        return 0.0
    if recompute == "selective":
        return float(attention)
    if recompute == "full":
        return 2 * L * (4 * h * h + 2 * h * cfg.ff_dim) + attention
    raise ValueError(f"recompute must be 'none', 'selective' or 'full', got {recompute!r}")


def flash_recompute_flops(cfg: GPTConfig, *, seq_len: int | None = None) -> float:
    """Extra FLOPs per token of a FlashAttention-style kernel: its backward recomputes the
    scores q·kᵀ instead of reading them back (Dao et al., 2022, "FlashAttention", §3.1 and the
    backward pass of appendix B), 2·L·h·s per token; they count in HFU, not in MFU."""
    return float(2 * cfg.n_layer * cfg.d_model * _seq(cfg, seq_len))


def step_flops(cfg: GPTConfig, batch: int, *, seq_len: int | None = None,
               recompute: str = "none") -> dict[str, float]:
    """``{"model": ..., "hardware": ...}`` FLOPs of one step of `batch` sequences of `seq_len`."""
    check_int("step_flops", "batch", batch)
    tokens = batch * _seq(cfg, seq_len)
    model = flops_per_token(cfg, seq_len=seq_len) * tokens
    return {"model": model,
            "hardware": model + recompute_flops(cfg, seq_len=seq_len, recompute=recompute) * tokens}


def _utilisation(flops: float, seconds: float, peak: float) -> float:
    if not (seconds > 0 and peak > 0 and flops >= 0):
        raise ValueError(f"need flops >= 0, seconds > 0 and peak > 0 FLOP/s, got {flops}, "
                         f"{seconds}, {peak}")
    return flops / seconds / peak


def mfu(model_flops: float, seconds: float, peak: float) -> float:
    """Model FLOPs utilisation: model FLOPs / seconds / peak FLOP/s (PaLM, appendix B)."""
    return _utilisation(model_flops, seconds, peak)


def hfu(hardware_flops: float, seconds: float, peak: float) -> float:
    """Hardware FLOPs utilisation: FLOPs done, recomputation included, / seconds / peak."""
    return _utilisation(hardware_flops, seconds, peak)


def count_flops(fn: Callable[[], object]) -> int:
    """FLOPs of the matmuls (mm, addmm, bmm, attention kernels) that ``fn()`` runs, forward and
    backward alike, counted by `torch.utils.flop_counter.FlopCounterMode`."""
    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


def matmul_peak(n: int = 512, *, repeats: int = 5, dtype: torch.dtype = torch.float32,
                device: torch.device | str = "cpu") -> float:
    """FLOP/s of an n×n by n×n matmul on `device`, best of `repeats`: a practical "peak" to
    compare a run with (no datasheet figure applies to a shared laptop core)."""
    device = torch.device(device)
    # CUDA kernels are asynchronous: time to the kernel's end, not to its launch.
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    a @ b  # warm-up: first call allocates and picks a kernel
    best = float("inf")
    for _ in range(max(1, repeats)):
        sync()
        t0 = time.perf_counter()
        a @ b
        sync()
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best


def timed(fn: Callable[[], Tensor | None], *, repeats: int = 3) -> float:
    """Seconds of ``fn()``, best of `repeats` (a busy machine only ever adds time)."""
    best = float("inf")
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best
