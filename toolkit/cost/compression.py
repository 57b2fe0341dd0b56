"""Bytes of compressed gradient and weight exchanges, and the error they may add: pure numbers.

Counted as the recorder counts a collective (`toolkit.comm`): the bytes one rank *passes in*.
The wire formats are those of `toolkit.data_parallel.quantize`, which the hooks send as one
uint8 payload per rank (scales first, then codes):

==================  ==========================================================================
exchange            bytes per rank passed in
==================  ==========================================================================
fp32 all-reduce     4n
QSGD, s levels      4·⌈n/d⌉ (one fp32 norm per block of d) + ⌈n·b/8⌉, b = 4 bits when
                    s ≤ 7, else 8 (sign and level in one code; Alistarh et al. 2017, §3.1)
top-k               8k: k fp32 values and k int32 indices (Stich et al. 2018; Lin et al. 2018)
scaled sign         4 + ⌈n/8⌉: one fp32 scale, one bit per element (Karimireddy et al. 2019)
1-bit all-reduce    all-to-all of p chunks (⌈n/p⌉ rounded up to a multiple of 8 elements, 1 bit
                    each, 4 bytes of scale per chunk or per block) then an all-gather of one
                    (Tang et al. 2021, 1-bit Adam: error-compensated on worker and server)
block int-b         4·⌈n/B⌉ + ⌈n·b/8⌉: one fp32 scale per block of B (ZeRO++'s qwZ at 8 bits,
                    qgZ at 4; Wang et al. 2023, §3)
==================  ==========================================================================

QSGD's quantizer is unbiased, E[Q(v)] = v, with E‖Q(v) − v‖² ≤ min(d/s², √d/s)·‖v‖² per block
of d elements (Alistarh et al., "QSGD", NeurIPS 2017, Lemma 3.1): `qsgd_variance_bound`.

ZeRO++ (Wang et al., "ZeRO++: Extremely Efficient Collective Communication for Giant Model
Training", 2023, arXiv:2306.10209, §3) cuts ZeRO-3's three exchanges of M = 2Ψ bytes (fp16
weights all-gathered in forward and again in backward, fp16 gradients reduce-scattered) to
0.5M (qwZ: int8 weights), 0 across nodes (hpZ: a secondary copy of the weights inside each node)
and 0.25M (qgZ: int4 gradients through an all-to-all): 3M → 0.75M across nodes
(`zeropp_volume`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..arguments import check_int

__all__ = ["ZeroPPRow", "block_quantized_bytes", "code_bits", "onebit_allreduce_bytes",
           "onebit_chunk", "qsgd_bytes", "qsgd_variance_bound", "sign_bytes", "topk_bytes",
           "topk_count", "zeropp_volume"]

SCALE_BYTES = 4
"""One fp32 scale (or norm) per block."""


def code_bits(levels: int) -> int:
    """Bits of one QSGD code: a sign and a level in 0…s fit 4 bits for s ≤ 7, else 8 (s ≤ 127)."""
    check_int("code_bits", "levels", levels, high=127, hint="s, quantization levels")
    return 4 if levels <= 7 else 8


def block_quantized_bytes(n: int, *, bits: int, block: int) -> int:
    """Bytes of n elements quantized to ``bits`` (4 or 8) in blocks of ``block``: a 4-byte scale
    per block, then the codes, two per byte at 4 bits."""
    check_int("block_quantized_bytes", "n", n, low=0)
    check_int("block_quantized_bytes", "block", block)
    if bits not in (4, 8):
        raise ValueError(f"block_quantized_bytes: bits must be 4 or 8, got {bits!r}")
    return SCALE_BYTES * math.ceil(n / block) + math.ceil(n * bits / 8)


def qsgd_bytes(n: int, *, levels: int, block: int) -> int:
    """Bytes one rank passes to the all-gather of QSGD codes: ⌈n/d⌉ norms and n codes."""
    return block_quantized_bytes(n, bits=code_bits(levels), block=block)


def qsgd_variance_bound(block: int, levels: int) -> float:
    """QSGD's bound on E‖Q(v) − v‖² / ‖v‖² for one block of d elements: min(d/s², √d/s)
    (Alistarh et al. 2017, Lemma 3.1 (ii))."""
    check_int("qsgd_variance_bound", "block", block, hint="d")
    check_int("qsgd_variance_bound", "levels", levels, hint="s")
    return min(block / levels**2, math.sqrt(block) / levels)


def topk_count(n: int, density: float) -> int:
    """k = ⌈density·n⌉ entries kept of n (at least 1)."""
    check_int("topk_count", "n", n)
    if not 0 < density <= 1:
        raise ValueError(f"topk_count: density must be in (0, 1], got {density!r}")
    return max(1, math.ceil(density * n))


def topk_bytes(k: int) -> int:
    """Bytes one rank passes to the all-gather of its top-k: k fp32 values, k int32 indices."""
    check_int("topk_bytes", "k", k)
    return 8 * k


def sign_bytes(n: int) -> int:
    """Bytes of a scaled sign vector: a 4-byte scale and one bit per element."""
    check_int("sign_bytes", "n", n)
    return SCALE_BYTES + math.ceil(n / 8)


def onebit_chunk(n: int, p: int) -> int:
    """Elements of one rank's chunk in the 1-bit all-reduce: ⌈n/p⌉ rounded up to a multiple of
    8 (whole bytes of signs); the vector is zero-padded to p chunks."""
    check_int("onebit_chunk", "n", n)
    check_int("onebit_chunk", "p", p)
    return 8 * math.ceil(math.ceil(n / p) / 8)


def onebit_allreduce_bytes(n: int, p: int, *, block: int | None = None) -> int:
    """Bytes one rank passes in per 1-bit all-reduce of n elements over p ranks: the all-to-all
    of p signed chunks of c elements (c/8 bytes of signs and 4 bytes per scale: one per chunk,
    or one per ``block``), then the all-gather of one."""
    c = onebit_chunk(n, p)
    scales = 1 if block is None else math.ceil(c / block)
    return (p + 1) * (c // 8 + SCALE_BYTES * scales)


@dataclass(frozen=True)
class ZeroPPRow:
    """One exchange of a ZeRO-3 step across nodes, in bytes per step for the whole model."""

    exchange: str
    zero3: float
    zeropp: float
    how: str


def zeropp_volume(n_params: int) -> list[ZeroPPRow]:
    """ZeRO-3 against ZeRO++ per step, M = 2Ψ bytes of fp16 weights (Wang et al. 2023, §3):
    forward all-gather M → 0.5M (int8), backward all-gather M → 0 across nodes (hpZ), gradient
    reduce-scatter M → 0.25M (int4); block scales left out, as in the paper's count."""
    check_int("zeropp_volume", "n_params", n_params)
    m = 2 * n_params
    return [ZeroPPRow("forward all-gather (weights)", m, m / 2, "qwZ: int8 blocks"),
            ZeroPPRow("backward all-gather (weights)", m, 0.0,
                      "hpZ: a second fp16 copy sharded inside the node"),
            ZeroPPRow("gradient reduce-scatter", m, m / 4, "qgZ: int4 blocks, all-to-all"),
            ZeroPPRow("total", 3 * m, 0.75 * m, "4× less")]
