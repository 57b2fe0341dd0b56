"""fp8 quantisation as 2025's training recipes do it: one scale per tensor, per 32-element block,
or per 1×128 tile and 128×128 block, emulated with torch's real fp8 dtypes.

An fp8 number holds a value x as cast(x · s) for a scale s chosen so that the tensor's largest
magnitude (its *amax*) lands near the format's largest value; x ≈ q / s. Formats (Micikevicius et
al., "FP8 Formats for Deep Learning", 2022, Table 1): e4m3 (largest 448, `torch.float8_e4m3fn`)
for weights and activations, e5m2 (largest 57344, `torch.float8_e5m2`) for gradients. What
differs between recipes is which elements share a scale and when it is computed:

    recipe          elements per scale        scale                              source
    delayed         the whole tensor          fp8_max / max(amax history)        Transformer Engine
                                              / 2^margin, from earlier steps     `DelayedScaling`
    current         the whole tensor          fp8_max / amax(x), this step       TE
                                                                                 `Float8CurrentScaling`
    MX              32 consecutive elements   2^(⌊log2 amax⌋ − emax_elem),       OCP MX spec v1.0
                    along a row               E8M0 (a power of two);             (conversion rule);
                                              or rounded up (no saturation)      Mishra et al. 2025
    tiles, blocks   1×128 activation tiles,   amax_block / fp8_max, fp32,        DeepSeek-V3 report
                    128×128 weight blocks     computed online                    §3.3.2

`emax_elem` is the exponent of the element format's largest normal: 8 for e4m3 (448 = 1.75·2^8),
15 for e5m2. The spec's rule can put a block's amax above the element maximum (1.9·2^8 > 448):
such values saturate, as the spec's conversion clamps them to the largest normal; rounding the
scale up instead (`quantize_mx(..., scale_rounding="up")`) avoids it.

Every cast here *saturates* (clamps to ±max before converting): an overflow costs the top of the
range, not an inf. torch's own CPU cast saturates e4m3 but turns e5m2 overflow into inf
(`toolkit.formats`, measured in lesson 05). Everything runs on the tensor's own device; the
quantised data are real fp8 tensors, dequantised by ``q.float() · scale_inv``.

Shapes: `quantize_tensor` takes any shape; `quantize_blocks` and `quantize_mx` take 2-D (rows,
cols) tensors and return one scale per block, (⌈rows/br⌉, ⌈cols/bc⌉); a block that does not fit
the tensor is clipped to it (TinyGPT's 32-wide layers are narrower than a 128-element tile).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..formats import FORMATS, format_info

FP8 = ("fp8 e4m3", "fp8 e5m2")
"""The two fp8 formats, by `toolkit.formats` name."""
E8M0_MIN, E8M0_MAX = -127, 127
"""Exponents an E8M0 scale holds (2^-127 … 2^127; the code 0xFF is NaN; OCP MX spec v1.0)."""


def _check_fp8(owner: str, fmt: str) -> None:
    if fmt not in FP8:
        raise ValueError(f"{owner}: fmt must be one of {list(FP8)}, got {fmt!r}")


def fp8_max(fmt: str) -> float:
    """Largest finite value of the fp8 format `fmt` (448 or 57344), read from torch."""
    _check_fp8("fp8_max", fmt)
    return format_info(fmt).max


def emax(fmt: str) -> int:
    """Exponent of the format's largest normal number: 8 for e4m3, 15 for e5m2."""
    return math.frexp(fp8_max(fmt))[1] - 1


def saturating_cast(x: Tensor, fmt: str) -> Tensor:
    """`x` clamped to ±(largest value of `fmt`) and cast to that fp8 dtype (round to nearest
    even). NaN stays NaN."""
    top = fp8_max(fmt)
    return x.float().clamp(-top, top).to(FORMATS[fmt])


def amax(x: Tensor) -> Tensor:
    """max |x| as a 0-d fp32 tensor on x's device."""
    return x.detach().abs().amax().float()


def scale_for(amax_value: Tensor, fmt: str, *, margin: int = 0) -> Tensor:
    """Transformer Engine's scale: s = fp8_max / amax / 2^margin, so the amax maps to
    2^-margin · fp8_max. An amax of 0 (or inf/NaN) gives s = 1."""
    a = amax_value.float()
    good = torch.isfinite(a) & (a > 0)
    s = fp8_max(fmt) / torch.where(good, a, torch.ones_like(a)) / 2.0 ** margin
    return torch.where(good, s, torch.ones_like(s))


@dataclass(frozen=True)
class Quantized:
    """An fp8 tensor with its dequantisation factors: x ≈ data · scale_inv, one factor per
    block of `block` = (rows, cols) elements (per tensor: the whole shape)."""

    data: Tensor
    """The fp8 values (`torch.float8_e4m3fn` or `torch.float8_e5m2`), x's shape."""
    scale_inv: Tensor
    """Dequantisation factors, (⌈rows/br⌉, ⌈cols/bc⌉), fp32 (E8M0 for MX); 0-d per tensor."""
    block: tuple[int, ...]
    """Elements each factor covers, e.g. (1, 128); the data's shape for one scale per tensor."""
    scale_bits: int = 32
    """Bits one stored factor takes: 32 (fp32) or 8 (E8M0)."""

    def dequantize(self) -> Tensor:
        """The values the fp8 data stand for, in fp32."""
        values = self.data.float()
        if self.scale_inv.dim() == 0:
            return values * self.scale_inv.float()
        rows, cols = values.shape
        br, bc = self.block
        factors = self.scale_inv.float().repeat_interleave(br, 0).repeat_interleave(bc, 1)
        return values * factors[:rows, :cols]

    @property
    def bits_per_element(self) -> float:
        """Storage per element, scales included: 8 + scale_bits / (elements per scale)."""
        per_scale = self.data.numel() / max(1, self.scale_inv.numel())
        return 8 + self.scale_bits / per_scale


def quantize_tensor(x: Tensor, fmt: str, scale: Tensor | float) -> Quantized:
    """One scale for the whole tensor: data = saturating_cast(x · scale)."""
    _check_fp8("quantize_tensor", fmt)
    s = torch.as_tensor(scale, dtype=torch.float32, device=x.device)
    return Quantized(saturating_cast(x.float() * s, fmt), (1.0 / s).reshape(()),
                     tuple(x.shape))


def current_scaling(x: Tensor, fmt: str = "fp8 e4m3", *, margin: int = 0) -> Quantized:
    """Per-tensor scaling from this tensor's own amax (one extra pass over x before the cast)."""
    return quantize_tensor(x, fmt, scale_for(amax(x), fmt, margin=margin))


def _block_amax(x: Tensor, block: tuple[int, int]) -> tuple[Tensor, tuple[int, int]]:
    """amax of every (br, bc) block of the 2-D x, blocks clipped to x: ((nr, nc), (br, bc))."""
    if x.dim() != 2:
        raise ValueError(f"block quantisation takes a 2-D (rows, cols) tensor, got shape "
                         f"{tuple(x.shape)}; reshape to (-1, x.shape[-1]) first")
    rows, cols = x.shape
    br, bc = min(block[0], rows), min(block[1], cols)
    nr, nc = math.ceil(rows / br), math.ceil(cols / bc)
    padded = x.detach().float().abs().new_zeros(nr * br, nc * bc)
    padded[:rows, :cols] = x.detach().float().abs()
    return padded.view(nr, br, nc, bc).amax(dim=(1, 3)), (br, bc)


def quantize_blocks(x: Tensor, fmt: str = "fp8 e4m3", *,
                    block: tuple[int, int] = (1, 128)) -> Quantized:
    """DeepSeek-V3's fine-grained quantisation (§3.3.2): one fp32 scale per (br, bc) block,
    computed online from the block's amax (scale_inv = amax / fp8_max). (1, 128): activation
    tiles (per token, per 128 channels); (128, 128): weight blocks."""
    _check_fp8("quantize_blocks", fmt)
    if len(block) != 2 or min(block) < 1:
        raise ValueError(f"quantize_blocks: block must be two positive ints, got {block!r}")
    block_amax, (br, bc) = _block_amax(x, block)
    scale = scale_for(block_amax, fmt)  # elementwise: 1 where a block is all zeros
    rows, cols = x.shape
    per_element = scale.repeat_interleave(br, 0).repeat_interleave(bc, 1)[:rows, :cols]
    return Quantized(saturating_cast(x.float() * per_element, fmt), 1.0 / scale, (br, bc))


def quantize_mx(x: Tensor, fmt: str = "fp8 e4m3", *, block: int = 32,
                scale_rounding: str = "floor") -> Quantized:
    """OCP MX spec v1.0's conversion from scalar floats: each run of `block` elements along a
    row shares X = 2^E, stored as E8M0 (`torch.float8_e8m0fnu`); elements =
    saturating_cast(x / X). `scale_rounding`:

    ``"floor"``  E = ⌊log2 amax⌋ − emax(fmt), the spec's rule: amax / X lies in [2^emax,
                 2^(emax+1)), above the element maximum (448 = 1.75·2^8) when amax's leading
                 digits exceed 1.75, and those values saturate;
    ``"up"``     E = ⌈log2(amax / fp8_max)⌉, rounding the scale up so nothing saturates (Mishra,
                 Stosic & Layton, "Recipes for Pre-training LLMs with MXFP8", 2025, who found
                 the spec's rule could make pre-training diverge).

    E is clamped to E8M0's [-127, 127]; an all-zero block gets 2^-127."""
    _check_fp8("quantize_mx", fmt)
    if scale_rounding not in ("floor", "up"):
        raise ValueError(f"quantize_mx: scale_rounding must be 'floor' or 'up', got "
                         f"{scale_rounding!r}")
    block_amax, (br, bc) = _block_amax(x, (1, block))
    tiny = block_amax.clamp_min(2.0 ** E8M0_MIN)  # log2(0) = -inf: an all-zero block
    if scale_rounding == "floor":
        exponent = torch.floor(torch.log2(tiny)) - emax(fmt)
    else:
        exponent = torch.ceil(torch.log2(tiny / fp8_max(fmt)))
    factor = torch.exp2(exponent.clamp(E8M0_MIN, E8M0_MAX))
    rows, cols = x.shape
    per_element = factor.repeat_interleave(bc, 1)[:rows, :cols]
    return Quantized(saturating_cast(x.float() / per_element, fmt),
                     factor.to(torch.float8_e8m0fnu), (br, bc), scale_bits=8)


@dataclass(frozen=True)
class DelayedScaling:
    """Transformer Engine's delayed-scaling recipe for one tensor (TE `recipe.DelayedScaling`;
    its defaults: margin 0, amax_history_len 1024, amax_compute_algo "max")."""

    fmt: str = "fp8 e4m3"
    """The fp8 format of this tensor (TE's HYBRID: e4m3 forward, e5m2 for gradients)."""
    margin: int = 0
    """The amax maps to fp8_max / 2^margin: headroom, in powers of two, for growth."""
    amax_history_len: int = 1024
    """How many past amaxes the scale looks at."""
    amax_compute_algo: str = "max"
    """"max" (the largest amax in the history) or "most_recent"."""

    def __post_init__(self) -> None:
        _check_fp8("DelayedScaling", self.fmt)
        if not (isinstance(self.amax_history_len, int) and self.amax_history_len >= 1):
            raise ValueError(f"DelayedScaling: amax_history_len must be an int >= 1, got "
                             f"{self.amax_history_len!r}")
        if self.amax_compute_algo not in ("max", "most_recent"):
            raise ValueError(f"DelayedScaling: amax_compute_algo must be 'max' or "
                             f"'most_recent', got {self.amax_compute_algo!r}")
        if not (isinstance(self.margin, int) and self.margin >= 0):
            raise ValueError(f"DelayedScaling: margin must be an int >= 0, got {self.margin!r}")


@dataclass
class DelayedScaler:
    """One tensor's delayed scale: `quantize(x)` casts with the scale computed from *earlier*
    amaxes (none yet: s = 1), then records amax(x) and updates the scale for the next call, as
    TE does between steps. `history` holds the last amaxes, newest last."""

    recipe: DelayedScaling = field(default_factory=DelayedScaling)
    history: list[float] = field(default_factory=list)
    scale: float = 1.0
    overflows: int = 0
    """Calls whose amax exceeded what the scale allowed (their top values saturated)."""

    def quantize(self, x: Tensor) -> Quantized:
        """Cast `x` with the current (delayed) scale, then update from its amax."""
        q = quantize_tensor(x, self.recipe.fmt, self.scale)
        a = float(amax(x))
        if a * self.scale > fp8_max(self.recipe.fmt):
            self.overflows += 1
        self.history = (self.history + [a])[-self.recipe.amax_history_len:]
        self.scale = next_delayed_scale(self.history, self.recipe, previous=self.scale)
        return q


def next_delayed_scale(history: list[float], recipe: DelayedScaling, *,
                       previous: float = 1.0) -> float:
    """The scale after `history` (amaxes, newest last; only the last amax_history_len count):
    fp8_max / (max or most recent) / 2^margin; `previous` when that amax is 0 or not finite."""
    window = history[-recipe.amax_history_len:]
    if not window:
        return previous
    a = max(window) if recipe.amax_compute_algo == "max" else window[-1]
    if not (math.isfinite(a) and a > 0):
        return previous
    return fp8_max(recipe.fmt) / a / 2.0 ** recipe.margin


def delayed_scales(amaxes: list[float], recipe: DelayedScaling) -> list[float]:
    """The scale each step of a run uses under `recipe`, given every step's amax: step t's
    scale comes from the amaxes of steps < t (1.0 at step 0)."""
    scales, scale = [], 1.0
    for t in range(len(amaxes)):
        scales.append(scale)
        scale = next_delayed_scale(amaxes[:t + 1], recipe, previous=scale)
    return scales


def scaled_matmul(a: Quantized, b: Quantized, *, out_dtype: torch.dtype = torch.bfloat16,
                  use_fast_accum: bool = False) -> Tensor:
    """a · bᵀ by torch's fp8 GEMM, ``torch._scaled_mm`` (per-tensor scales; on a GPU the
    tensor cores): a (M, K), b (N, K) → (M, N) in `out_dtype`. On a GPU M, N and K must be
    multiples of 16. `use_fast_accum` is Hopper's faster, less precise accumulation."""
    if a.scale_inv.dim() != 0 or b.scale_inv.dim() != 0:
        raise ValueError("scaled_matmul: per-tensor scales only (quantize_tensor / "
                         "current_scaling); dequantize block-scaled tensors instead")
    # _scaled_mm wants the second operand column-major: bᵀ of a row-major (N, K) tensor is.
    return torch._scaled_mm(a.data, b.data.t(), scale_a=a.scale_inv.float(),
                            scale_b=b.scale_inv.float(), out_dtype=out_dtype,
                            use_fast_accum=use_fast_accum)


__all__ = ["DelayedScaler", "DelayedScaling", "E8M0_MAX", "E8M0_MIN", "FP8", "Quantized", "amax",
           "current_scaling", "delayed_scales", "emax", "fp8_max", "next_delayed_scale",
           "quantize_blocks", "quantize_mx", "quantize_tensor", "saturating_cast", "scale_for",
           "scaled_matmul"]
