"""Floating-point formats of training: what each keeps, loses, and rounds to (pure math).

A binary float with e exponent bits and m mantissa (fraction) bits stores ±(1 + f·2^-m)·2^E for
normal numbers, E from 2 − 2^(e−1) upward, and ±f·2^-m·2^(2 − 2^(e−1)) below them (subnormals,
with precision falling to nothing). So (IEEE 754-2008 §3.3-3.4 for fp32 and fp16):

    spacing at x (ulp)        2^(⌊log2|x|⌋ − m) for normal x
    smallest normal           2^(2 − 2^(e−1))
    smallest subnormal        smallest normal · 2^-m
    relative rounding error   ≤ 2^-(m+1)  (half an ulp)

    format    e   m   largest          smallest normal   smallest subnormal   source
    fp32      8  23   3.4·10^38        1.2·10^-38        1.4·10^-45           IEEE 754
    fp16      5  10   65504            6.1·10^-5         6.0·10^-8            IEEE 754
    bf16      8   7   3.4·10^38        1.2·10^-38        9.2·10^-41           Kalamkar et al. 2019
    fp8 e4m3  4   3   448 (no inf)     2^-6              2^-9                 Micikevicius et al.
    fp8 e5m2  5   2   57344            2^-14             2^-16                2022, Table 1

The table is not typed in anywhere: `format_info` reads `torch.finfo` and builds the smallest
subnormal from its bit pattern (the integer 1 reinterpreted as the format), and the tests check
both against the formulas above. Everything here is a pure function of numbers and tensors on
the host: no processes, no distributed state.

    from toolkit import formats
    formats.format_info("bf16").smallest_subnormal       # 9.18e-41
    formats.cast(torch.tensor([1e-8]), "fp16")           # tensor([0.], dtype=torch.float64)
    formats.ulp(1.0, "bf16")                             # 0.0078125: lr·g below half of it is lost
    formats.survival(grads.abs(), "fp16")                # fractions flushed / subnormal / ...
    formats.sequential_sum(values, torch.bfloat16)       # a running sum rounded at every add

**Units of bytes**, the course's one convention wherever a size is printed or drawn: memory,
tensor and message sizes in IEC binary units, KiB = 2¹⁰, MiB = 2²⁰, GiB = 2³⁰, TiB = 2⁴⁰ bytes
(`human_bytes` writes them, `byte_unit` picks one for an axis); rates in decimal units, GB/s =
10⁹ bytes per second, as vendors' datasheets, NVMe drives and nccl-tests quote them; a product
keeps its vendor's name (an "80 GB" H100 holds 80 GiB; a "30 TB" disk array 30·10¹² bytes, 27.3
TiB). A figure's axis and the labels beside it use the same unit.

    formats.human_bytes(4000)                            # '3.91 KiB'
    formats.byte_unit(3 * 2**30)                         # ('GiB', 1073741824)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

FORMATS: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp8 e4m3": torch.float8_e4m3fn,
    "fp8 e5m2": torch.float8_e5m2,
}
"""The formats of mixed-precision training, by the name lessons and figures use."""

_BITS_AS_INT = {8: torch.uint8, 16: torch.int16, 32: torch.int32}  # same width, to reinterpret


@dataclass(frozen=True)
class Format:
    """One floating-point format, read from torch (`format_info`)."""

    name: str
    """Short name, a key of `FORMATS`."""
    dtype: torch.dtype
    """The torch dtype."""
    bits: int
    """Bits per number (bytes = bits / 8)."""
    exponent_bits: int
    """e: bits of the exponent; it sets the range."""
    mantissa_bits: int
    """m: bits of the fraction; it sets the precision (m + 1 significant bits)."""
    max: float
    """Largest finite value."""
    smallest_normal: float
    """Smallest positive normal value, 2^(2 − 2^(e−1))."""
    smallest_subnormal: float
    """Smallest positive value at all, smallest_normal · 2^-m."""
    eps: float
    """Spacing of the numbers just above 1.0, 2^-m."""
    has_inf: bool
    """Whether overflow gives inf (fp8 e4m3 has no inf; its overflow is NaN or saturation)."""

    @property
    def bytes(self) -> int:
        return self.bits // 8


def _check_name(owner: str, name: str) -> torch.dtype:
    if name not in FORMATS:
        raise ValueError(f"{owner}: format must be one of {list(FORMATS)}, got {name!r}")
    return FORMATS[name]


def format_info(name: str) -> Format:
    """The `Format` named `name` (a key of `FORMATS`), from ``torch.finfo`` and bit patterns."""
    dtype = _check_name("format_info", name)
    fi = torch.finfo(dtype)
    mantissa = round(-math.log2(fi.eps))
    # The smallest subnormal is the bit pattern 0...01: reinterpret the integer 1 as the format.
    one = torch.ones(1, dtype=_BITS_AS_INT[fi.bits], device="cpu")
    subnormal = one.view(dtype).to(torch.float64).item()
    inf = torch.full((1,), float("inf"), device="cpu").to(dtype).to(torch.float64)
    has_inf = bool(torch.isinf(inf).item())
    return Format(name=name, dtype=dtype, bits=fi.bits, exponent_bits=fi.bits - 1 - mantissa,
                  mantissa_bits=mantissa, max=float(fi.max),
                  smallest_normal=float(fi.smallest_normal), smallest_subnormal=subnormal,
                  eps=float(fi.eps), has_inf=has_inf)


def cast(values: Tensor, name: str) -> Tensor:
    """`values` rounded to the format `name` (round to nearest even), returned in float64 so the
    result can be compared and printed exactly: what a tensor of that dtype would hold."""
    dtype = _check_name("cast", name)
    return values.to(torch.float64).to(dtype).to(torch.float64)


def ulp(x: float, name: str) -> float:
    """Spacing between |x| and the next representable number away from zero in `name`: an
    update smaller than half of it leaves a weight of size |x| unchanged (round to nearest).
    At a power of two the spacing toward zero is half of it; below the normal range the
    spacing is the smallest subnormal."""
    f = format_info(name)
    if not math.isfinite(x):
        raise ValueError(f"ulp: x must be finite, got {x!r}")
    if abs(x) < f.smallest_normal:
        return f.smallest_subnormal
    exponent = math.frexp(abs(x))[1] - 1  # |x| = 1.f · 2^exponent
    return 2.0 ** (exponent - f.mantissa_bits)


def survival(magnitudes: Tensor, name: str) -> dict[str, float]:
    """What becomes of values of these magnitudes stored in `name`, as fractions that add to 1:

    ``zero``       rounds to 0 (|x| ≤ half the smallest subnormal): the value is lost;
    ``subnormal``  kept with fewer significant bits (stored below the smallest normal);
    ``normal``     kept with full precision (relative error ≤ 2^-(m+1));
    ``overflow``   beyond the largest value plus half an ulp: inf (or NaN / saturation in e4m3).

    Exact zeros in `magnitudes` count as ``normal`` (zero is represented exactly).
    """
    f = format_info(name)
    a = magnitudes.detach().to(torch.float64).abs().reshape(-1)
    if a.numel() == 0:
        raise ValueError("survival: magnitudes is empty")
    total = a.numel()
    nonzero = a > 0
    half = f.smallest_subnormal / 2  # half the spacing below the smallest normal
    zero = (nonzero & (a <= half)).sum().item()  # the tie rounds to the even neighbour, 0
    # Just below the smallest normal, values round up to it: they are stored as normals.
    sub = (nonzero & (a > half) & (a < f.smallest_normal - half)).sum().item()
    overflow = (a >= f.max + ulp(f.max, name) / 2).sum().item()
    return {"zero": zero / total, "subnormal": sub / total,
            "normal": (total - zero - sub - overflow) / total, "overflow": overflow / total}


def sequential_sum(values: Tensor, dtype: torch.dtype) -> Tensor:
    """Sum of ``values[0] + values[1] + ...`` along the first dimension, rounded to `dtype`
    after every addition, as a ring reduce-scatter does (each rank adds its contribution to the
    running chunk it received, in the dtype on the wire); returned in float64.

    values: (n, ...) → (...). In float32 or float64 this is ordinary summation; in bf16 a sum
    stops growing once the addend falls below half an ulp of it (1000 ones sum to 256)."""
    if values.dim() < 1 or values.shape[0] < 1:
        raise ValueError(f"sequential_sum: values must have a first dimension >= 1, got shape "
                         f"{tuple(values.shape)}")
    if not dtype.is_floating_point:
        raise ValueError(f"sequential_sum: dtype must be a floating dtype, got {dtype}")
    acc = values[0].to(dtype)
    for v in values[1:]:
        acc = acc + v.to(dtype)  # computed wider, stored (rounded) in dtype, as on the wire
    return acc.to(torch.float64)


BYTE_UNITS = (("B", 1), ("KiB", 2**10), ("MiB", 2**20), ("GiB", 2**30), ("TiB", 2**40))
"""IEC binary units of bytes, smallest first (module docstring: the course's convention)."""


def byte_unit(nbytes: float) -> tuple[str, int]:
    """(name, bytes) of the largest IEC unit not above |nbytes| (B below 1 KiB): the unit an
    axis showing values up to `nbytes` should use."""
    if not isinstance(nbytes, (int, float)) or math.isnan(nbytes):
        raise ValueError(f"byte_unit: nbytes must be a number of bytes, got {nbytes!r}")
    name, size = BYTE_UNITS[0]
    for unit, scale in BYTE_UNITS:
        if abs(nbytes) >= scale:
            name, size = unit, scale
    return name, size


def human_bytes(nbytes: float) -> str:
    """`nbytes` in the largest IEC unit that keeps it ≥ 1, to 3 significant digits: 512 →
    '512 B', 4096 → '4 KiB', 4000 → '3.91 KiB', 1.5·2²⁰ → '1.5 MiB'."""
    unit, scale = byte_unit(nbytes)
    value = nbytes / scale
    if unit == "B" or value == int(value):
        return f"{value:.0f} {unit}"
    return f"{value:.3g} {unit}"


__all__ = ["BYTE_UNITS", "FORMATS", "Format", "byte_unit", "cast", "format_info", "human_bytes",
           "sequential_sum", "survival", "ulp"]
