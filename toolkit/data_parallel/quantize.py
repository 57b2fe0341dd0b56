"""Compressors for gradients and weights, and the error-feedback memory that makes biased ones
converge. Tensor in, codes out, codes back in; nothing here communicates.

* **QSGD** (Alistarh, Grubic, Li, Tomioka & Vojnovic, "QSGD: Communication-Efficient SGD via
  Gradient Quantization and Encoding", NeurIPS 2017, §3.1). Per block v of d elements and s
  levels, element i becomes ‖v‖₂·sgn(vᵢ)·ξᵢ/s with ξᵢ = ℓ + 1 with probability s|vᵢ|/‖v‖₂ − ℓ,
  else ℓ = ⌊s|vᵢ|/‖v‖₂⌋. So E[ξᵢ/s] = |vᵢ|/‖v‖₂: the quantizer is **unbiased**, and its variance
  is at most min(d/s², √d/s)·‖v‖² (Lemma 3.1; `toolkit.cost.compression.qsgd_variance_bound`).
  Sent: one fp32 norm per block and a signed code in −s…s per element (4 bits for s ≤ 7).
* **Block quantization** (ZeRO++'s qwZ and qgZ; Wang et al. 2023, §3): per block of B elements,
  scale = max|x| / (2^(b−1) − 1) and code = round(x/scale), b = 8 or 4 bits: deterministic,
  error at most scale/2 per element.
* **Top-k** (Stich, Cordonnier & Jaggi, "Sparsified SGD with Memory", NeurIPS 2018; Lin et al.,
  "Deep Gradient Compression", ICLR 2018): keep the k entries largest in magnitude, send values
  and indices.
* **Scaled sign** (Karimireddy, Rebjock, Stich & Jaggi, "Error Feedback Fixes SignSGD and other
  Gradient Compression Schemes", ICML 2019, Algorithm 1; the 1-bit of Tang et al. 2021's 1-bit
  Adam): C(x) = (‖x‖₁/n)·sign(x), the scale that minimises ‖x − c·sign(x)‖₂; one bit per element.

Top-k and sign are *biased*: E[C(x)] ≠ x, and SGD on C(g) alone can stall (what top-k never
sends, it never applies). **Error feedback** (`ErrorFeedback`) keeps what was not applied and
adds it to the next gradient: with eₜ the memory,

    aₜ = gₜ + eₜ₋₁            (what this rank means to send)
    eₜ = aₜ − C(aₜ)           (what it did not)

so C(a₁) + … + C(aₜ) = g₁ + … + gₜ − eₜ: every gradient is applied, late, and the delay is
bounded by the memory (Stich et al. 2018 prove top-k with memory converges at SGD's rate). For
top-k the bookkeeping is exact in floating point: kept entries are copied and the rest zeroed, so
eₜ + C(aₜ) equals aₜ bit for bit.

Wire format: `to_payload` lays a compressed tensor out as one uint8 vector (fp32 scales first,
then the codes), so one all-gather carries it and the recorder's byte count is the payload's.
Shapes: flat (n,) vectors; blocks are consecutive, the last may be short.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..arguments import check_int

__all__ = ["ErrorFeedback", "block_dequantize", "block_quantize", "from_payload", "pack_int4",
           "pack_signs", "qsgd_dequantize", "qsgd_quantize", "sign_compress", "sign_decompress",
           "to_payload", "topk_compress", "topk_decompress", "unpack_int4", "unpack_signs"]


def _blocks(x: Tensor, block: int) -> Tensor:
    """x (n,) zero-padded to a multiple of ``block``, as (⌈n/block⌉, block)."""
    n = x.numel()
    pad = (-n) % block
    return torch.cat([x.reshape(-1), x.new_zeros(pad)]).view(-1, block)


def qsgd_quantize(v: Tensor, *, levels: int, block: int,
                  generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """QSGD's stochastic quantization of v (n,): (codes int8 (n,) in −s…s, norms fp32 (⌈n/d⌉,)).
    ``generator`` (on v's device) draws the rounding; ranks should draw independently."""
    check_int("qsgd_quantize", "levels", levels, high=127, hint="s")
    check_int("qsgd_quantize", "block", block, hint="d")
    rows = _blocks(v.float(), block)                                  # (blocks, d)
    norms = rows.norm(dim=1)                                          # ‖v‖₂ per block
    scaled = rows.abs() * levels / norms.clamp_min(1e-30)[:, None]    # s|vᵢ|/‖v‖ in [0, s]
    low = scaled.floor()
    draw = torch.rand(scaled.shape, generator=generator, device=v.device)
    level = low + (draw < scaled - low).float()                       # ℓ or ℓ + 1, unbiased
    codes = (torch.sign(rows) * level).reshape(-1)[: v.numel()].to(torch.int8)
    return codes, norms


def qsgd_dequantize(codes: Tensor, norms: Tensor, *, levels: int, block: int) -> Tensor:
    """The fp32 vector (n,) the codes stand for: ‖v‖·code/s per element."""
    n = codes.numel()
    rows = _blocks(codes.float(), block)
    return (rows * norms[:, None] / levels).reshape(-1)[:n]


def block_quantize(x: Tensor, *, bits: int, block: int) -> tuple[Tensor, Tensor]:
    """Symmetric per-block quantization: (codes int8 (n,), scales fp32 (⌈n/B⌉,)), each code in
    −(2^(b−1)−1)…2^(b−1)−1, x ≈ code·scale within scale/2."""
    if bits not in (4, 8):
        raise ValueError(f"block_quantize: bits must be 4 or 8, got {bits!r}")
    check_int("block_quantize", "block", block)
    top = 2 ** (bits - 1) - 1                                          # 7 or 127
    rows = _blocks(x.float(), block)
    scales = rows.abs().amax(dim=1) / top
    codes = torch.round(rows / scales.clamp_min(1e-30)[:, None]).clamp_(-top, top)
    return codes.reshape(-1)[: x.numel()].to(torch.int8), scales


def block_dequantize(codes: Tensor, scales: Tensor, *, block: int) -> Tensor:
    """The fp32 vector (n,) of block-quantized codes."""
    n = codes.numel()
    return (_blocks(codes.float(), block) * scales[:, None]).reshape(-1)[:n]


def pack_int4(codes: Tensor) -> Tensor:
    """Codes in −8…7 (int8, (n,)) as ⌈n/2⌉ bytes, two per byte (low nibble first)."""
    nibbles = (codes.to(torch.int16) + 8).to(torch.uint8)             # 0…15
    if nibbles.numel() % 2:
        nibbles = torch.cat([nibbles, nibbles.new_zeros(1)])
    pairs = nibbles.view(-1, 2)
    return pairs[:, 0] | (pairs[:, 1] << 4)


def unpack_int4(packed: Tensor, n: int) -> Tensor:
    """The n int8 codes of `pack_int4`."""
    both = torch.stack([packed & 0xF, packed >> 4], dim=1).reshape(-1)[:n]
    return (both.to(torch.int16) - 8).to(torch.int8)


def pack_signs(x: Tensor) -> Tensor:
    """One bit per element (1 where x ≥ 0), eight per byte: (⌈n/8⌉,) uint8."""
    bits = (x.reshape(-1) >= 0).to(torch.uint8)
    pad = (-bits.numel()) % 8
    bits = torch.cat([bits, bits.new_zeros(pad)]).view(-1, 8)
    weights = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8, device=x.device)
    return (bits * weights).sum(dim=1).to(torch.uint8)


def unpack_signs(packed: Tensor, n: int) -> Tensor:
    """±1.0 (fp32, (n,)) from `pack_signs`."""
    shifts = torch.arange(8, device=packed.device, dtype=torch.uint8)
    bits = (packed[:, None] >> shifts) & 1
    return bits.reshape(-1)[:n].float() * 2 - 1


def sign_compress(x: Tensor, *, block: int | None = None) -> tuple[Tensor, Tensor]:
    """(packed signs (⌈n/8⌉,) uint8, scales fp32): scale = mean |x| over the whole vector
    (``block=None``: one scale, (1,)) or over each block of ``block`` elements (⌈n/block⌉,)."""
    if block is None:
        return pack_signs(x), x.float().abs().mean().reshape(1)
    check_int("sign_compress", "block", block)
    rows = _blocks(x.float(), block).abs()
    n, full = x.numel(), x.numel() // block
    sums = rows.sum(dim=1)
    counts = torch.full_like(sums, float(block))
    if full < sums.numel():
        counts[-1] = n - full * block            # the short last block's mean is over its own
    return pack_signs(x), sums / counts


def sign_decompress(packed: Tensor, scales: Tensor, n: int, *, block: int | None = None) -> Tensor:
    """scale·sign, (n,) fp32, with the scales of `sign_compress` (same ``block``)."""
    signs = unpack_signs(packed, n)
    if block is None:
        return signs * scales
    return (_blocks(signs, block) * scales[:, None]).reshape(-1)[:n]


def topk_compress(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """(values fp32 (k,), indices int32 (k,)) of the k entries of x (n,) largest in magnitude."""
    check_int("topk_compress", "k", k, high=x.numel())
    indices = x.abs().topk(k, sorted=False).indices
    return x[indices].float(), indices.to(torch.int32)


def topk_decompress(values: Tensor, indices: Tensor, n: int) -> Tensor:
    """A dense (n,) fp32 vector, zero except at ``indices`` (repeated indices add)."""
    out = values.new_zeros(n, dtype=torch.float32)
    return out.index_add_(0, indices.long(), values.float())


def to_payload(*tensors: Tensor) -> Tensor:
    """The tensors' bytes, concatenated, as one uint8 vector (what goes on the wire)."""
    return torch.cat([t.contiguous().reshape(-1).view(torch.uint8) for t in tensors])


def from_payload(payload: Tensor, specs: list[tuple[torch.dtype, int]]) -> list[Tensor]:
    """Split a uint8 payload back into tensors of the given (dtype, numel), in order."""
    out, start = [], 0
    for dtype, numel in specs:
        size = numel * dtype.itemsize
        out.append(payload[start: start + size].clone().view(dtype))   # clone: aligned storage
        start += size
    if start != payload.numel():
        raise ValueError(f"from_payload: the specs cover {start} bytes of a {payload.numel()}-byte "
                         "payload")
    return out


class ErrorFeedback:
    """Per-key memory e of what compression left out: `compensate` returns g + e, `remember`
    stores e = (g + e) − applied. Keys are whatever identifies a buffer (a bucket index)."""

    def __init__(self) -> None:
        self.residual: dict = {}

    def compensate(self, key: object, grad: Tensor) -> Tensor:
        """aₜ = gₜ + eₜ₋₁ (a new tensor; e starts at zero)."""
        e = self.residual.get(key)
        return grad.clone() if e is None else grad + e

    def remember(self, key: object, meant: Tensor, applied: Tensor) -> None:
        """eₜ = aₜ − C(aₜ): what was meant but not applied."""
        self.residual[key] = meant - applied

    def norm(self) -> float:
        """‖e‖₂ over every key (0 with no memory yet)."""
        return math.sqrt(sum(float(e.pow(2).sum()) for e in self.residual.values()))
