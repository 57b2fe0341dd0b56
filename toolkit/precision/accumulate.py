"""Rounding to a given number of fraction bits, and matmuls whose running sum keeps only that many:
what the accumulator of a matrix unit does to a long dot product, emulated exactly in float64.

A float with m fraction bits rounds x to the nearest multiple of 2^(⌊log2|x|⌋ − m), a relative
error of at most 2^-(m+1) (IEEE 754-2008 §4.3). `round_to_bits(x, m)` does that with an unbounded
exponent (no overflow, no subnormals): m = 23 is fp32's rounding, 10 is fp16's and TF32's, 7 is
bf16's, 3 is e4m3's. A dot product of length K summed in a running accumulator of m bits rounds K
times; once the sum is 2^(m+1) times larger than a term, the term no longer changes it.

    accumulated_matmul(a, b, bits=7)                       every addition rounded to bf16
    accumulated_matmul(a, b, bits=13, promote_every=128)   DeepSeek-V3 §3.3.2: a limited
                                                           accumulator (~14 significant bits on
                                                           H800) added into fp32 every N_C = 128
    accumulated_matmul(a, b, bits=23)                      fp32 accumulation

The tensor cores' own accumulation order and rounding are not documented to this detail; this is
a model of an accumulator, not of a particular chip: a product of two fp8 (or bf16) numbers is
exact in fp32, and each addition rounds once, to nearest or toward zero.

`tf32(x)`: fp32 values rounded to TF32's 10 fraction bits, what a tensor core reads from fp32
inputs when TF32 is on (NVIDIA A100 architecture whitepaper: 8 exponent and 10 mantissa bits,
accumulation in fp32); `torch.backends.cuda.matmul.allow_tf32` (off by default since PyTorch 1.12)
or ``torch.set_float32_matmul_precision("high")`` turn it on.

Shapes: a (M, K) @ b (K, N) → (M, N), returned in float64.
"""

from __future__ import annotations

import torch
from torch import Tensor

MODES = ("nearest", "toward_zero")
"""Rounding of each addition: to nearest (ties to even), or truncation toward zero."""
FP32_BITS, TF32_BITS, BF16_BITS = 23, 10, 7
"""Fraction bits of fp32, TF32 and bf16."""


def round_to_bits(x: Tensor, bits: int, *, mode: str = "nearest") -> Tensor:
    """`x` (any float dtype) rounded to `bits` fraction bits (bits + 1 significant), exponent
    unbounded; returned in float64. Zeros, infs and NaNs pass through."""
    if not (isinstance(bits, int) and 0 <= bits <= 52):
        raise ValueError(f"round_to_bits: bits must be an int in [0, 52], got {bits!r}")
    if mode not in MODES:
        raise ValueError(f"round_to_bits: mode must be one of {MODES}, got {mode!r}")
    x = x.double()
    mantissa, exponent = torch.frexp(x)  # x = mantissa · 2^exponent, 0.5 <= |mantissa| < 1
    grid = 2.0 ** (bits + 1)             # the mantissa's bits + 1 significant bits as integers
    steps = torch.round(mantissa * grid) if mode == "nearest" else torch.trunc(mantissa * grid)
    out = torch.ldexp(steps / grid, exponent)
    return torch.where(torch.isfinite(x), out, x)


def tf32(x: Tensor) -> Tensor:
    """fp32 values as TF32 holds them (10 fraction bits, round to nearest), in x's dtype."""
    return round_to_bits(x, TF32_BITS).to(x.dtype)


def accumulated_matmul(a: Tensor, b: Tensor, *, bits: int, promote_every: int | None = None,
                       mode: str = "nearest") -> Tensor:
    """a @ b with every product exact and the running sum over K rounded to `bits` fraction
    bits after each addition (`mode`); with `promote_every` = N_C, the partial sum is added into
    an fp32 accumulator (rounded to 23 bits, to nearest) every N_C terms and restarted at 0.
    a (M, K), b (K, N) → (M, N) float64."""
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"accumulated_matmul: need a (M, K) and b (K, N), got {tuple(a.shape)} "
                         f"and {tuple(b.shape)}")
    if promote_every is not None and not (isinstance(promote_every, int) and promote_every >= 1):
        raise ValueError(f"accumulated_matmul: promote_every must be None or an int >= 1, got "
                         f"{promote_every!r}")
    a, b = a.double(), b.double()
    partial = a.new_zeros(a.shape[0], b.shape[1])
    total = a.new_zeros(a.shape[0], b.shape[1])
    for k in range(a.shape[1]):
        # (M, 1) * (1, N): the K-th outer product, exact in float64 for inputs of <= 26 bits.
        partial = round_to_bits(partial + a[:, k:k + 1] * b[k:k + 1, :], bits, mode=mode)
        if promote_every is not None and (k + 1) % promote_every == 0:
            total = round_to_bits(total + partial, FP32_BITS)
            partial = torch.zeros_like(partial)
    if promote_every is None:
        return partial
    return round_to_bits(total + partial, FP32_BITS)


def relative_error(approx: Tensor, exact: Tensor) -> float:
    """max |approx − exact| / max |exact|: the error of a matmul's outputs relative to their
    scale (elementwise ratios blow up where an exact output happens to be near 0)."""
    exact = exact.double()
    return float((approx.double() - exact).abs().max() / exact.abs().max().clamp_min(1e-300))


__all__ = ["BF16_BITS", "FP32_BITS", "MODES", "TF32_BITS", "accumulated_matmul",
           "relative_error", "round_to_bits", "tf32"]
