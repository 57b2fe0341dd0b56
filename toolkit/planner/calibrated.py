"""The planner's step time rebuilt from this machine's own measured rates: one rank's training
step of a dp × tp layout as a list of operations, each priced at a rate measured at its size.

`plan.predict` prices a step as hardware FLOPs / (peak · efficiency) plus α-β communication, the
method of Narayanan et al. (SC 2021, §3). On a GPU at scale the matmuls are nearly all of the
work. On CPU ranks with h = 128 they are not: LayerNorm, GELU, the softmax, the loss and the
optimizer count no FLOPs but take time, thin matmuls (tp splits every weight) run slower than
one big one, and every module call costs Python time. So this model keeps the planner's
structure and replaces its one assumed rate by one rate per kind of operation, each measured at
the size the step uses (the roofline's way of pricing kernel by kernel, Williams et al., CACM
2009; `toolkit.roofline` counts FLOPs and bytes the same way):

    step = Σ_ops count(op) · work(op) / rate(op)        compute, forward + backward
         + m · glue                                     a micro-batch beyond its ops
         + 4·L·m · AR_tp(b·s·h · 4 B)                   Megatron's f and g, α-β of groups of tp
         + AR_dp(4 B · P)                               one flat bucket of the gradients

`step_ops(cfg, layout, global_batch=B)` lists what one rank runs per step, with b = B/(dp·m)
sequences per micro-batch, t = b·s tokens, p = tp, f = d_ff, a heads of d = h/a, P this rank's
parameters (`local_params`):

==============  ==================  ======================  ===================================
kind            shape               work (forward+backward) what
==============  ==================  ======================  ===================================
`linear`        (t, k, n, bias)     3 · 2·t·k·n FLOPs       q, k, v (t, h, h/p), out (t, h/p, h),
                                                            up (t, h, f/p), down (t, f/p, h)
                                                            (out, down: no bias when p > 1),
                                                            lm_head (t, h, V, no bias)
`attention`     (b, a/p, s, d)      12·b·(a/p)·s²·d FLOPs   q·kᵀ and ·v, 2 + 4 matmuls, with the
                                                            scale, causal mask and softmax
`layernorm`     (t, h)              4 B · 5·t·h             ln_1, ln_2 (2 per layer), ln_f
`gelu`          (t, f/p)            4 B · 5·t·f/p           read x, write y; read dy, x, write dx
`residual`      (t, h)              4 B · 6·t·h             x + branch, and the two gradients
                                                            that meet at x summed in backward
`bias`          (t, h)              4 B · 3·t·h             tp > 1: a row-parallel layer's bias,
                                                            added after the all-reduce (2/layer)
`copy`          (t, h)              4 B · 2·t·h             tp > 1: the contiguous copy each
                                                            all-reduce of f and g works on
`embedding`     (t, h)              4 B · 6·t·h             token + position lookup, their grads
`loss`          (t, V)              4 B · 5·t·V             cross-entropy over V logits
`accumulate`    (P,)                4 B · 3·P               micro-batches 2 … m add into .grad
`optimizer`     (P,)                4 B · 3·P               SGD: read w, g, write w
`flatten`       (P,)                4 B · 6·P               dp: cat the grads, divide, copy back
==============  ==================  ======================  ===================================

A work unit is a definition, not a claim about what the hardware moves: a measured rate is
work / measured time at that size, so the sum is exactly as good as "each op costs in a step
what it costs alone at its size". `Calibration.glue` adds what a whole micro-batch costs beyond
its ops (module calls, views, the autograd graph), measured on one sequence. What the sum still
leaves out grows with the activations a step keeps: an op timed alone finds its inputs in cache,
while backward reads what forward saved long before (lesson 14 measures the gap).

Time here is **core time**: CPU seconds a rank spends (`time.process_time`, every thread), the
analogue of a GPU's busy time. Wall time on a shared 2-core machine running 4 ranks also holds
the moments a rank waits for a core, a factor of the machine's load at that moment and of how
often the ranks synchronise, which no model of the layout's work sees; lesson 14 measures it.

Pure numbers (measured rates in, seconds out); the measurement that fills a `Calibration` is
`toolkit.experiments.planner.calibrate`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from ..arguments import check_ints, check_positive
from ..cost import AlphaBeta, predict as collective_time
from ..models import GPTConfig
from .layout import Layout

__all__ = ["Calibration", "CalibratedPrediction", "KINDS", "MATMUL_KINDS", "Op", "dense_ops",
           "kendall_tau", "local_params", "op_work", "predict_calibrated", "step_ops",
           "tp_messages"]

ELEM = 4  # bytes per element: the runs on CPU train in fp32
MATMUL_KINDS = ("linear", "attention")
"""Kinds whose work is FLOPs (rates in FLOP/s); the others' work is bytes (rates in byte/s)."""
_BYTES_PER_ELEMENT_TOUCHED = {  # elements read + written, forward + backward, per shape element
    "layernorm": 5, "gelu": 5, "residual": 6, "bias": 3, "copy": 2, "embedding": 6, "loss": 5,
    "accumulate": 3, "optimizer": 3, "flatten": 6}
KINDS = MATMUL_KINDS + tuple(_BYTES_PER_ELEMENT_TOUCHED)
"""Every kind of operation `step_ops` lists (module docstring)."""


@dataclass(frozen=True, order=True)
class Op:
    """One kind of operation at one size: ``Op("linear", (256, 128, 512, 1))``."""

    kind: str
    """One of `KINDS`."""
    shape: tuple[int, ...]
    """Sizes as the module docstring's table gives them."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Op: kind must be one of {KINDS}, got {self.kind!r}")
        check_ints("Op", low=0, **{f"shape[{i}]": n for i, n in enumerate(self.shape)})

    def label(self) -> str:
        """``"linear 256×128×512"``: the kind and its sizes (a bias flag left out)."""
        dims = self.shape[:3] if self.kind == "linear" else self.shape
        return f"{self.kind} " + "×".join(str(n) for n in dims)


def op_work(op: Op) -> float:
    """Work of one forward + backward of `op`: FLOPs for `MATMUL_KINDS`, else bytes (table)."""
    if op.kind == "linear":
        t, k, n = op.shape[:3]
        return 3 * 2.0 * t * k * n  # forward, grad of the input, grad of the weight
    if op.kind == "attention":
        b, a, s, d = op.shape
        return 12.0 * b * a * s * s * d  # 2 matmuls of 2·s²·d per head forward, 4 backward
    return float(ELEM * _BYTES_PER_ELEMENT_TOUCHED[op.kind] * math.prod(op.shape))


def local_params(cfg: GPTConfig, tp: int) -> int:
    """Parameters one tensor-parallel rank holds of a `TinyGPT` (tied head counted once):
    embeddings, LayerNorms and the row-parallel biases whole, every weight matrix and the
    column-parallel biases 1/tp."""
    h, f, L = cfg.d_model, cfg.ff_dim, cfg.n_layer
    per_layer = (4 * h * h + 2 * h * f) // tp + (3 * h + f) // tp + 2 * h + 4 * h
    head = 0 if cfg.tie_weights else cfg.vocab_size * h
    return cfg.vocab_size * h + cfg.seq_len * h + L * per_layer + 2 * h + head


def _check_layout(cfg: GPTConfig, layout: Layout, global_batch: int) -> None:
    if layout.pp != 1 or layout.cp != 1 or layout.zero != 0 or layout.ep != 1:
        raise ValueError(f"the calibrated model covers dp × tp layouts with ZeRO 0 (what "
                         f"toolkit.experiments.planner runs), got {layout.label()}")
    check_ints("step_ops", global_batch=global_batch)
    if global_batch % (layout.dp * layout.micro_batches):
        raise ValueError(f"step_ops: global_batch={global_batch} must split into dp × m = "
                         f"{layout.dp} × {layout.micro_batches} micro-batches")
    if cfg.n_head % layout.tp or cfg.ff_dim % layout.tp:
        raise ValueError(f"step_ops: tp={layout.tp} must divide n_head={cfg.n_head} and "
                         f"d_ff={cfg.ff_dim}")


def step_ops(cfg: GPTConfig, layout: Layout, *, global_batch: int) -> dict[Op, int]:
    """What one rank computes in one training step: each `Op` and how many times (module
    docstring's table). Communication is not an op here: `tp_messages` and `dp_bytes`."""
    _check_layout(cfg, layout, global_batch)
    p, m, L = layout.tp, layout.micro_batches, cfg.n_layer
    b = global_batch // (layout.dp * m)
    s, h, f, V = cfg.seq_len, cfg.d_model, cfg.ff_dim, cfg.vocab_size
    t, P = b * s, local_params(cfg, p)
    ops: dict[Op, int] = {}

    def add(kind: str, shape: tuple[int, ...], n: int) -> None:
        if n:
            key = Op(kind, shape)
            ops[key] = ops.get(key, 0) + n

    add("embedding", (t, h), m)
    add("layernorm", (t, h), m * (2 * L + 1))
    add("linear", (t, h, h // p, 1), m * 3 * L)           # q, k, v: columns
    add("attention", (b, cfg.n_head // p, s, cfg.head_dim), m * L)
    # A row-parallel layer adds its bias once, after the all-reduce (a dense one in addmm).
    row_bias = int(p == 1)
    add("linear", (t, h // p, h, row_bias), m * L)        # out_proj: rows
    add("residual", (t, h), m * 2 * L)
    add("linear", (t, h, f // p, 1), m * L)               # up_proj: columns
    add("gelu", (t, f // p), m * L)
    add("linear", (t, f // p, h, row_bias), m * L)        # down_proj: rows
    if p > 1:
        add("bias", (t, h), m * 2 * L)                    # out_proj's and down_proj's
        add("copy", (t, h), m * 4 * L)                    # each all-reduce works on a copy
    add("linear", (t, h, V, 0), m)                        # lm_head, whole on every rank
    add("loss", (t, V), m)
    add("accumulate", (P,), m - 1)
    add("optimizer", (P,), 1)
    add("flatten", (P,), 1 if layout.dp > 1 else 0)
    return ops


def dense_ops(cfg: GPTConfig, tokens: int) -> dict[Op, int]:
    """The ops of one dense micro-batch of `tokens` tokens, forward + backward (no optimizer):
    what `Calibration.glue` subtracts from a whole model's time."""
    if tokens % cfg.seq_len:
        raise ValueError(f"dense_ops: tokens={tokens} must be whole sequences of "
                         f"seq_len={cfg.seq_len}")
    ops = step_ops(cfg, Layout(), global_batch=tokens // cfg.seq_len)
    return {op: n for op, n in ops.items() if op.kind not in ("accumulate", "optimizer")}


def tp_messages(cfg: GPTConfig, layout: Layout, *, global_batch: int) -> tuple[int, float]:
    """(count, bytes) of one step's tensor-parallel all-reduces on a rank: Megatron's f and g,
    2 forward + 2 backward per layer and micro-batch, each one (b, s, h) fp32 activation."""
    _check_layout(cfg, layout, global_batch)
    if layout.tp == 1:
        return 0, 0.0
    b = global_batch // (layout.dp * layout.micro_batches)
    return 4 * cfg.n_layer * layout.micro_batches, float(b * cfg.seq_len * cfg.d_model * ELEM)


@dataclass(frozen=True)
class Calibration:
    """This machine's rates, measured on the ranks that run the steps (core time)."""

    rates: Mapping[Op, float]
    """Work per core second of each op at its size: FLOP/s for `MATMUL_KINDS`, byte/s else."""
    links: Mapping[int, AlphaBeta]
    """All-reduce α-β per group size p (ring coefficients), fitted in core seconds with every
    rank in one group of p at once, as the layouts use them."""
    source: str = ""
    """Where and how it was measured."""
    glue: float = 0.0
    """Seconds per micro-batch that a whole model's forward + backward costs beyond the sum of
    its ops timed alone (`dense_ops`): module calls, views, the autograd graph. Measured on
    one sequence, where the ops cost least and the difference is most precise."""
    spread: Mapping[Op, float] = field(default_factory=dict)
    """Half the interquartile range / median of each rate's repeated measurements."""

    def __post_init__(self) -> None:
        if not self.glue >= 0:
            raise ValueError(f"Calibration: glue must be >= 0 seconds, got {self.glue!r}")
        for op, rate in self.rates.items():
            check_positive("Calibration", f"rate of {op.label()}", rate)

    def rate(self, op: Op) -> float:
        """The rate measured for `op`; for a size not measured, that of the nearest measured
        size of the same kind (by work, on a log scale), a stated approximation."""
        if op in self.rates:
            return self.rates[op]
        same = [o for o in self.rates if o.kind == op.kind]
        if not same:
            raise ValueError(f"Calibration: no {op.kind!r} rate measured (needed for "
                             f"{op.label()}); calibrate with a layout that runs it")
        near = min(same, key=lambda o: abs(math.log(op_work(o) / op_work(op))))
        return self.rates[near]

    def link(self, p: int) -> AlphaBeta:
        """The all-reduce link of groups of `p` ranks."""
        try:
            return self.links[p]
        except KeyError:
            raise ValueError(f"Calibration: no all-reduce over {p} ranks measured; measured "
                             f"group sizes: {sorted(self.links)}") from None


@dataclass(frozen=True)
class CalibratedPrediction:
    """One rank's step of one layout, in core seconds, by part."""

    parts: Mapping[str, float]
    """Seconds per kind of op (`KINDS`, those the step runs), "glue" (`Calibration.glue`),
    then "tp_comm" and "dp_comm"."""
    @property
    def compute(self) -> float:
        """Seconds of every op and the glue (all but the communication)."""
        return sum(v for k, v in self.parts.items() if k not in ("tp_comm", "dp_comm"))

    @property
    def matmul(self) -> float:
        """Seconds of the `MATMUL_KINDS`: what FLOPs / peak set out to count."""
        return sum(self.parts.get(k, 0.0) for k in MATMUL_KINDS)

    @property
    def step(self) -> float:
        """Core seconds per step: compute (ops and glue) + tp_comm + dp_comm."""
        return sum(self.parts.values())


def predict_calibrated(cfg: GPTConfig, layout: Layout, calibration: Calibration, *,
                       global_batch: int) -> CalibratedPrediction:
    """Core seconds of one training step of `cfg` under `layout` on the calibrated machine
    (module docstring): each op's work at its measured rate, the tp and dp all-reduces by the
    measured α-β of their group size."""
    parts: dict[str, float] = {}
    for op, n in step_ops(cfg, layout, global_batch=global_batch).items():
        parts[op.kind] = parts.get(op.kind, 0.0) + n * op_work(op) / calibration.rate(op)
    parts["glue"] = layout.micro_batches * calibration.glue
    count, nbytes = tp_messages(cfg, layout, global_batch=global_batch)
    parts["tp_comm"] = count * float(collective_time(
        "all_reduce", "ring", nbytes, layout.tp, calibration.link(layout.tp))) if count else 0.0
    parts["dp_comm"] = float(collective_time(
        "all_reduce", "ring", local_params(cfg, layout.tp) * ELEM, layout.dp,
        calibration.link(layout.dp))) if layout.dp > 1 else 0.0
    return CalibratedPrediction(parts=parts)


def kendall_tau(a: Sequence[float], b: Sequence[float]) -> float:
    """Kendall's rank correlation τ_a of two equally long sequences (Kendall, Biometrika 30,
    1938): (concordant − discordant pairs) / all pairs; 1 when both order the items alike, −1
    when reversed. A tie in either counts as neither."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(f"kendall_tau: need two sequences of the same length >= 2, got "
                         f"{len(a)} and {len(b)}")
    pairs = [(i, j) for i in range(len(a)) for j in range(i + 1, len(a))]
    score = sum(math.copysign(1, (a[i] - a[j]) * (b[i] - b[j])) if (a[i] - a[j]) * (b[i] - b[j])
                else 0 for i, j in pairs)
    return score / len(pairs)
