"""The roofline model: how fast a kernel can run, from its arithmetic intensity and two numbers
of the machine.

Williams, Waterman & Patterson, "Roofline: An Insightful Visual Performance Model for Multicore
Architectures", CACM 52(4), 2009: a kernel that does F floating-point operations and moves Q
bytes between the processor and memory has arithmetic intensity I = F / Q (FLOP per byte), and
on a machine of peak P (FLOP/s) and memory bandwidth W (byte/s) it attains at most

    attainable(I) = min(P, I · W)           ridge point I* = P / W

Left of the ridge a kernel is **memory-bound** (the slope, I·W), right of it **compute-bound**
(the flat roof, P). Time has the same bound, t ≥ max(F / P, Q / W), so a sequence of kernels takes
at least Σ max(F_k / P, Q_k / W), and the best model-FLOPs utilisation it allows is
ΣF_k / P ÷ Σ max(F_k / P, Q_k / W) (`mfu_bound`).

Counting (forward pass; e bytes per element; the minimum traffic: each operand read once and
each result written once, which a cache holds only when it fits):

* `linear`: x (t, k) @ W (k, m) + b → (t, m) for t = micro-batch · sequence tokens:
  F = 2·t·k·m, Q = e·(t·k + k·m + m + t·m): the activations (read x: t·k, write y: t·m) and
  the weights (k·m, and m of bias). Two limits (`linear_limits`), which cross at
  t× = k·m / (k + m) tokens, where both terms move the same bytes:

  - few tokens (t ≪ t×): the **weights** dominate the bytes, Q ≈ e·k·m, so I ≈ 2·t / e: every
    weight read from memory serves 2 FLOPs per token, and the intensity grows with t;
  - many tokens (t ≫ t×): the weight bytes vanish beside the activations', Q ≈ e·t·(k + m), so
    I → 2·k·m / (e·(k + m)): per token the layer reads k inputs and writes m outputs for
    2·k·m FLOPs. **The cap comes from the activation traffic**, not from the weights.

  Between the two, **micro-batch size moves a linear layer along the roof**; past t× it hardly
  moves (half the cap at t×, 90 % of it at 9·t×).
* `attention` (the core softmax(q kᵀ / √d) v of b sequences of s tokens, h = a heads × d):
  F = 4·b·s²·h (q kᵀ and the weighted sum of v, 2·b·s²·h each; PaLM appendix B's 4·h·s per token).
  Unfused, as `TinyGPT.attend` runs it (five kernels over the (b, a, s, s) scores: q kᵀ writes
  them, the scaling, the causal mask and the softmax each read and write them, · v reads them):
  Q = e·(4·b·s·h + 8·a·b·s²), I = 4·s·h / (e·(4·h + 8·a·s)), **independent of b**. Fused
  (FlashAttention, Dao et al. 2022, section 3: the scores stay on chip): Q = e·4·b·s·h, I = s / e,
  if q, k, v and the output cross memory once each (the floor; its Theorem 2, section 3.2, counts
  Θ(s²d²/M) accesses per head for on-chip memory M, k and v re-read per block of queries).
* `layernorm`: per element 8 FLOPs (mean: 1 add; variance: subtract, square, add; normalise:
  subtract, multiply; affine: multiply, add); Q = e·(2·t·h + 2·h): I ≈ 4 / e, independent of b.

The datasheet machines (`A100_SXM`, `H100_SXM`) pair `toolkit.flops`'s bf16 dense peaks with
the HBM bandwidth of the same datasheets; `Roof` holds any machine, measured ones included
(`toolkit.experiments.roofline.measure_roof`). Pure numbers: no process, no timing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from .arguments import check_int, check_ints, check_positive, check_positives
from .flops import A100_BF16, H100_SXM_BF16
from .models import GPTConfig

__all__ = ["A100_SXM", "A100_SXM_BANDWIDTH", "DATASHEET_ROOFS", "H100_SXM", "H100_SXM_BANDWIDTH",
           "Kernel", "PUBLISHED_MFU", "Roof", "attainable", "attention", "gpt_block_kernels",
           "layernorm", "linear", "linear_limits", "mfu_bound", "roofline_time",
           "tokens_to_ridge"]

A100_SXM_BANDWIDTH = 2.039e12  # byte/s, NVIDIA A100 datasheet, 80 GB SXM, HBM2e
H100_SXM_BANDWIDTH = 3.35e12   # byte/s, NVIDIA H100 datasheet, SXM5, HBM3

PUBLISHED_MFU: dict[str, float] = {
    "GPT-3 175B (V100)": 0.213,
    "PaLM 540B (TPU v4)": 0.462,
}
"""Model FLOPs utilisation of published training runs (Chowdhery et al. 2022, "PaLM", Table 3)."""


@dataclass(frozen=True)
class Roof:
    """A machine for the roofline: peak FLOP/s and memory bandwidth (byte/s)."""

    name: str
    """What the numbers describe, e.g. ``"A100 SXM bf16"`` or ``"this machine, 1 core"``."""
    peak_flops: float
    """Peak (or measured best) FLOP/s: the flat roof."""
    bandwidth: float
    """Memory bandwidth, byte/s: the slope."""

    def __post_init__(self) -> None:
        check_positives("Roof", peak_flops=self.peak_flops, bandwidth=self.bandwidth)

    @property
    def ridge(self) -> float:
        """FLOP per byte where the slope meets the roof, P / W."""
        return self.peak_flops / self.bandwidth

    def attainable(self, intensity: float) -> float:
        """min(P, I·W), FLOP/s."""
        return attainable(intensity, peak_flops=self.peak_flops, bandwidth=self.bandwidth)


A100_SXM = Roof("A100 SXM bf16", A100_BF16, A100_SXM_BANDWIDTH)
H100_SXM = Roof("H100 SXM bf16", H100_SXM_BF16, H100_SXM_BANDWIDTH)
DATASHEET_ROOFS: dict[str, Roof] = {r.name: r for r in (A100_SXM, H100_SXM)}
"""The published machines by name (dense bf16 peak; HBM bandwidth; sources above)."""


@dataclass(frozen=True)
class Kernel:
    """The work of one kernel (or layer): FLOPs and bytes moved to and from memory."""

    name: str
    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOP per byte."""
        return self.flops / self.bytes


def attainable(intensity: float, *, peak_flops: float, bandwidth: float) -> float:
    """The roofline: min(peak_flops, intensity · bandwidth), FLOP/s (Williams et al. 2009)."""
    check_positives("attainable", intensity=intensity, peak_flops=peak_flops,
                    bandwidth=bandwidth)
    return min(peak_flops, intensity * bandwidth)


def linear(tokens: int, d_in: int, d_out: int, *, bytes_per_element: int = 4,
           bias: bool = True, name: str = "linear") -> Kernel:
    """x (tokens, d_in) @ W (d_in, d_out) (+ b): 2·t·k·m FLOPs, e·(t·k + k·m + t·m (+ m)) bytes."""
    check_ints("linear", tokens=tokens, d_in=d_in, d_out=d_out,
               bytes_per_element=bytes_per_element)
    elements = tokens * d_in + d_in * d_out + tokens * d_out + (d_out if bias else 0)
    return Kernel(name, 2.0 * tokens * d_in * d_out, float(bytes_per_element * elements))


def attention(batch: int, seq_len: int, d_model: int, n_head: int, *,
              bytes_per_element: int = 4, fused: bool = False,
              name: str = "attention") -> Kernel:
    """The attention core of `batch` sequences (module docstring): 4·b·s²·h FLOPs; bytes
    e·(4·b·s·h + 8·a·b·s²) unfused (TinyGPT's five kernels over the scores), e·4·b·s·h fused."""
    check_ints("attention", batch=batch, seq_len=seq_len, d_model=d_model, n_head=n_head,
               bytes_per_element=bytes_per_element)
    b, s, h, a = batch, seq_len, d_model, n_head
    elements = 4 * b * s * h + (0 if fused else 8 * a * b * s * s)
    return Kernel(name, 4.0 * b * s * s * h, float(bytes_per_element * elements))


def layernorm(tokens: int, d_model: int, *, bytes_per_element: int = 4,
              name: str = "layernorm") -> Kernel:
    """LayerNorm over d_model for `tokens` rows: 8 FLOPs per element; reads x, weight and bias,
    writes y: e·(2·t·h + 2·h) bytes."""
    check_ints("layernorm", tokens=tokens, d_model=d_model, bytes_per_element=bytes_per_element)
    return Kernel(name, 8.0 * tokens * d_model,
                  float(bytes_per_element * (2 * tokens * d_model + 2 * d_model)))


def gpt_block_kernels(cfg: GPTConfig, micro_batch: int, *, seq_len: int | None = None,
                      bytes_per_element: int = 4, fused: bool = False) -> list[Kernel]:
    """The forward kernels of one `TinyGPT` block on `micro_batch` sequences, in order:
    ln_1, q/k/v projections, attention core, out_proj, ln_2, up_proj, down_proj (GELU, the
    residual adds and dropout are left out: elementwise, like layernorm's intensity)."""
    check_int("gpt_block_kernels", "micro_batch", micro_batch)
    s = cfg.seq_len if seq_len is None else check_int("gpt_block_kernels", "seq_len", seq_len)
    t, h, f, e = micro_batch * s, cfg.d_model, cfg.ff_dim, bytes_per_element
    return [layernorm(t, h, bytes_per_element=e, name="ln_1"),
            *(linear(t, h, h, bytes_per_element=e, name=n) for n in ("q_proj", "k_proj", "v_proj")),
            attention(micro_batch, s, h, cfg.n_head, bytes_per_element=e, fused=fused),
            linear(t, h, h, bytes_per_element=e, name="out_proj"),
            layernorm(t, h, bytes_per_element=e, name="ln_2"),
            linear(t, h, f, bytes_per_element=e, name="up_proj"),
            linear(t, f, h, bytes_per_element=e, name="down_proj")]


def roofline_time(kernels: Iterable[Kernel], roof: Roof) -> float:
    """Seconds the kernels take at least, one after another: Σ max(F / P, Q / W)."""
    total = 0.0
    for k in kernels:
        total += max(k.flops / roof.peak_flops, k.bytes / roof.bandwidth)
    return total


def mfu_bound(kernels: Sequence[Kernel], roof: Roof) -> float:
    """The highest model-FLOPs utilisation the roofline allows these kernels:
    ΣF / P ÷ Σ max(F / P, Q / W); 1 only when every kernel is compute-bound."""
    if not kernels:
        raise ValueError("mfu_bound: kernels is empty; pass at least one Kernel")
    return sum(k.flops for k in kernels) / roof.peak_flops / roofline_time(kernels, roof)


def linear_limits(d_in: int, d_out: int, *, bytes_per_element: int = 4) -> dict[str, float]:
    """The two regimes of a linear layer's intensity (module docstring), for k = d_in,
    m = d_out, e bytes per element: ``crossover`` t× = k·m / (k + m) tokens, where the weights
    and the activations move equal bytes; ``small_t_slope`` 2 / e, the intensity per token
    while the weights dominate (I ≈ 2·t / e); ``cap`` 2·k·m / (e·(k + m)), the limit as t → ∞
    set by the activations each token reads (k) and writes (m)."""
    check_ints("linear_limits", d_in=d_in, d_out=d_out, bytes_per_element=bytes_per_element)
    k, m, e = d_in, d_out, bytes_per_element
    return {"crossover": k * m / (k + m), "small_t_slope": 2 / e, "cap": 2 * k * m / (e * (k + m))}


def tokens_to_ridge(d_in: int, d_out: int, roof: Roof, *, bytes_per_element: int = 4,
                    bias: bool = True) -> int | None:
    """The fewest tokens t at which `linear(t, d_in, d_out)` reaches the ridge point of `roof`
    (becomes compute-bound), or None when even t → ∞ stays below it: the cap
    2·k·m / (e·(k + m)) (`linear_limits`), set by the activation traffic per token (read k,
    write m), is under the ridge, and no micro-batch size helps."""
    check_ints("tokens_to_ridge", d_in=d_in, d_out=d_out, bytes_per_element=bytes_per_element)
    check_positive("tokens_to_ridge", "ridge", roof.ridge)
    k, m, e = d_in, d_out, bytes_per_element
    # 2tkm ≥ I*·e·(tk + km + tm + m)  ⇔  t·(2km − I*e(k + m)) ≥ I*e·(km + m)
    slope = 2 * k * m - roof.ridge * e * (k + m)
    if slope <= 0:
        return None
    t = max(1, int(roof.ridge * e * (k * m + (m if bias else 0)) // slope))
    while linear(t, k, m, bytes_per_element=e, bias=bias).intensity < roof.ridge:
        t += 1  # the division above rounds down; at most a step or two
    while t > 1 and linear(t - 1, k, m, bytes_per_element=e, bias=bias).intensity >= roof.ridge:
        t -= 1
    return t
