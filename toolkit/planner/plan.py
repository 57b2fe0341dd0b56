"""Predict memory per GPU and step time of a parallel layout, enumerate layouts, rank them.

For a transformer (L layers, hidden h, a heads, vocabulary V), a global batch of B sequences of
s tokens, a `Layout` (dp, tp, pp, cp, ZeRO stage, m micro-batches of b = B/(dp·m) sequences,
recompute policy, attention kind) and a `Cluster`:

Memory of the busiest GPU (the first pipeline stage, which also holds the embeddings):

    states       model_state_bytes(Ψ_stage / tp, n_d = dp·cp, stage)     ZeRO §5 (toolkit.memory)
    activations  (L/pp) · act(s, cp, b, tp, sp, recompute, attention)    Korthikanti et al. 2022,
                 · min(pp, m)                                             Table 2; 1F1B holds
                 + full recompute: one layer's activations (rerun)        min(p, m) micro-batches
                 + selective: one layer's scores (rerun)
    buffers      ZeRO-3: two layers' gathered 16-bit parameters (the one running, the prefetch)

with Ψ_stage = Ψ at pp = 1, else (L/pp)·(12h² + 13h) + V·h + s·h. `act` charges a rank s/cp
queries against all s keys (scores linear in cp; none with flash-style attention). Allocator
fragmentation, communication buffers and workspaces are not counted; instead a layout **fits**
when states + activations + buffers ≤ (1 − headroom) · the GPU's memory, `headroom` =
`MEMORY_HEADROOM` (10 %, the margin the MoE planner `experts.predict_moe` keeps too; an
assumption: ZeRO, Rajbhandari et al. 2020, §3.2, saw fragmentation alone leave over 30 % of
memory unusable in extreme cases).

Step time, α-β links of the cluster (`toolkit.cost.predict`, ring algorithms):

    compute  = hardware FLOPs / world / (peak · efficiency)        toolkit.flops: 6N + 12·L·h·s
                                                                   per token; + recomputation
    slot     = compute/m                              one micro-batch through one stage
               + (L/pp) · (4 or 6) · AR_tp(b·s/cp·h·2 B)   Megatron: 2 all-reduces forward, 2
                                                           back (+2 in a fully recomputed forward)
               + (L/pp) · 3(cp−1) · p2p(2·b·s/cp·h/tp·2 B) ring attention: K, V; dK, dV
               + 2 · p2p(b·s/cp·h/tp · 2 B)                activation out, its gradient back
    pipeline = (m + pp − 1) · slot                         1F1B/GPipe: bubble (pp − 1)·slot,
                                                           (p − 1)/(m + p − 1) of the time
    dp       = AR_dp(G)  (ZeRO 0), RS(G) + AG(P) (ZeRO 1-2), 2·AG(P) + RS(G) (ZeRO 3), over the
               dp·cp ranks holding the same weights; G, P: this GPU's gradient and parameter bytes
    step     = pipeline + dp
    MFU      = model FLOPs / (step · world · peak)                 (PaLM, app. B)
    HFU      = hardware FLOPs (recomputation counted) / (step · world · peak)

FlashAttention's own recomputation of q·kᵀ in its backward (2·L·h·s FLOPs per token, 0.5 % of
GPT-3's step) is left out of the compute. Nothing overlaps in this model (DDP hides much of `dp`
behind backward; ring attention hides its sends behind attention), so predicted times are upper
bounds, comparable between layouts. A group uses the intra-node link when its ranks lie in one
node (`Layout.span`), else the inter-node link. Source of the method: Narayanan et al., SC 2021,
§3 (the same terms, reasoned about one at a time).
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass

import pandas as pd

from ..arguments import check_ints
from ..flops import step_flops
from ..memory import ATTENTION, RECOMPUTE, GiB, MIXED_ADAM, ModelShape, Recipe, model_shape
from ..memory import activation_bytes_per_layer, model_state_bytes
from ..models import GPTConfig, gpt_param_count
from ..cost.bubble import bubble_fraction, peak_activations
from .cluster import Cluster
from .comm import exchange_time, micro_batch_comm
from .layout import Layout

__all__ = ["EFFICIENCY", "MEMORY_HEADROOM", "Prediction", "as_shape", "divisors", "layouts", "plan",
           "predict", "stage_params"]

MEMORY_HEADROOM = 0.10
"""Share of every GPU's memory a layout that fits leaves free, for what the model does not count
(allocator fragmentation, communication buffers, workspaces). An assumption of this course, not
a measurement: ZeRO (Rajbhandari et al., 2020, §3.2) saw fragmentation alone leave over 30 % of
memory unusable in extreme cases; 10 % is a margin, not a guarantee. The MoE planner
(`experts.MEMORY_HEADROOM`) keeps the same."""

EFFICIENCY = 0.5
"""Assumed fraction of peak FLOP/s the matmuls reach (an assumption, not a measurement:
Megatron-LM reports 44-52 % of A100 peak at scale, Narayanan et al. 2021, Table 1, counting
the recomputed forward as work done: hardware FLOPs, not model FLOPs)."""


def as_shape(model: ModelShape | GPTConfig | str) -> ModelShape:
    """A `ModelShape` from a name in `toolkit.memory.MODELS`, a shape, or a `GPTConfig`
    (whose MLP must be 4h wide, the shape the formulas assume)."""
    if isinstance(model, str):
        return model_shape(model)
    if isinstance(model, ModelShape):
        return model
    if isinstance(model, GPTConfig):
        if model.ff_dim != 4 * model.d_model:
            raise ValueError(f"as_shape: the planner assumes d_ff = 4·d_model, got d_ff="
                             f"{model.ff_dim} for d_model={model.d_model}")
        return ModelShape(f"GPT L{model.n_layer} h{model.d_model}", model.n_layer, model.d_model,
                          model.n_head, model.vocab_size, model.seq_len,
                          published=gpt_param_count(model), tied=model.tie_weights)
    raise TypeError(f"as_shape: model must be a name, a ModelShape or a GPTConfig, "
                    f"got {type(model).__name__}")


def _config(shape: ModelShape, seq_len: int) -> GPTConfig:
    # Only sizes matter to toolkit.flops; nothing is allocated.
    return GPTConfig(vocab_size=shape.vocab, seq_len=max(seq_len, shape.seq_len),
                     d_model=shape.hidden, n_head=shape.heads, n_layer=shape.layers,
                     tie_weights=shape.tied)


def stage_params(shape: ModelShape, pp: int) -> float:
    """Parameters on the first (busiest) pipeline stage: all of Ψ at pp = 1, else L/pp layers of
    12h² + 13h plus the token and position embeddings (V·h + s·h)."""
    h = shape.hidden
    if pp == 1:
        return float(shape.num_params)
    return shape.layers / pp * (12 * h * h + 13 * h) + shape.vocab * h + shape.seq_len * h


@dataclass(frozen=True)
class Prediction:
    """Memory (bytes) of the busiest GPU and step time (seconds) of one layout."""

    states: float
    """Parameters, gradients and optimizer state (ZeRO stage over dp·cp)."""
    activations: float
    """Activations held at the peak: in-flight micro-batches × this stage's layers."""
    buffers: float
    """ZeRO-3's gathered parameters of two layers (0 otherwise)."""
    fits: bool
    """states + activations + buffers <= (1 − headroom) · the GPU's memory."""
    compute: float
    """Seconds of arithmetic per GPU, no bubble (hardware FLOPs / (peak · efficiency))."""
    tp_comm: float
    """Seconds of tensor-parallel all-reduces per step (all micro-batches)."""
    cp_comm: float
    """Seconds of ring-attention key/value passing per step."""
    pp_comm: float
    """Seconds of pipeline point-to-point sends per step (activations and their gradients)."""
    bubble: float
    """Seconds stages sit idle while the pipeline fills and drains: (pp − 1) slots."""
    bubble_fraction: float
    """(pp − 1)/(m + pp − 1): the idle fraction of the pipeline's time."""
    dp_comm: float
    """Seconds of the data-parallel gradient exchange (and ZeRO-3's gathers) per step."""
    step: float
    """Predicted seconds per step: pipeline (compute + tp + cp + pp + bubble) + dp."""
    model_flops: float
    """FLOPs of one step as the model counts them (6N + 12·L·h·s per token), all GPUs."""
    mfu: float
    """model_flops / (step · world · peak): model FLOPs utilisation."""
    hfu: float
    """Hardware FLOPs (recomputation included) / (step · world · peak); equals mfu without
    recomputation."""
    tokens_per_s: float
    """B·s / step."""
    ep_comm: float = 0.0
    """Seconds of the MoE layers' token all-to-alls per step (`predict_moe`; 0 for dense)."""
    expert_states: float = 0.0
    """Bytes of the experts' states, a part of `states` (`predict_moe`; 0 for dense)."""

    @property
    def memory(self) -> float:
        """Bytes the busiest GPU needs: states + activations + buffers."""
        return self.states + self.activations + self.buffers


def predict(model: ModelShape | GPTConfig | str, cluster: Cluster, layout: Layout, *,
            global_batch: int, seq_len: int | None = None, recipe: Recipe = MIXED_ADAM,
            efficiency: float = EFFICIENCY, elem_bytes: int = 2,
            headroom: float | None = None) -> Prediction:
    """Memory per GPU and step time of `layout` on `cluster` (module docstring for the model).

    `global_batch` is B, sequences per step; `seq_len` s defaults to the model's. B must split
    into dp × m micro-batches of whole sequences, cp must divide s, tp the heads, pp the layers.
    `elem_bytes`: bytes of one activation element on the wire (2 for bf16, 4 for fp32 on CPU).
    `headroom`: share of the GPU's memory a fitting layout leaves free (None:
    `MEMORY_HEADROOM`).
    """
    shape = as_shape(model)
    s = shape.seq_len if seq_len is None else seq_len
    layout.check(cluster.world_size)
    d = layout
    if d.ep > 1:
        raise ValueError(f"predict: ep={d.ep} shards experts, which {shape.name} has none of; "
                         f"use planner.predict_moe with an MoEShape")
    check_ints("predict", global_batch=global_batch, seq_len=s)
    if not 0 < efficiency <= 1:
        raise ValueError(f"predict: efficiency must be in (0, 1], got {efficiency!r}")
    headroom = _headroom(headroom)
    for what, n, k in (("heads", shape.heads, d.tp), ("layers", shape.layers, d.pp),
                       ("seq_len", s, d.cp),
                       ("global_batch", global_batch, d.dp * d.micro_batches)):
        if n % k:
            raise ValueError(f"predict: {what}={n} is not divisible by {k} "
                             f"({d.label()}); choose degrees that divide it")
    b = global_batch // (d.dp * d.micro_batches)  # sequences per micro-batch
    s_local, layers = s // d.cp, shape.layers // d.pp
    h, sp = shape.hidden, d.sequence_parallel and d.tp > 1

    # Memory of the first stage.
    params = stage_params(shape, d.pp) / d.tp
    states = model_state_bytes(params, d.dp * d.cp, d.zero, recipe).total
    act_kw = dict(seq_len=s, batch=b, hidden=h, heads=shape.heads, tensor_parallel=d.tp,
                  sequence_parallel=sp, context_parallel=d.cp, attention=d.attention)
    per_layer = activation_bytes_per_layer(**act_kw, recompute=d.recompute)
    in_flight = peak_activations("1f1b", p=d.pp, m=d.micro_batches)
    acts = layers * per_layer * in_flight
    plain = activation_bytes_per_layer(**act_kw, recompute="none")
    if d.recompute == "full":  # backward reruns one layer at a time: its internals come back
        acts += plain
    elif d.recompute == "selective":  # ... or one layer's attention core: its scores come back
        acts += plain - per_layer
    layer_params = (12 * h * h + 13 * h) / d.tp
    buffers = 2 * layer_params * recipe.param_bytes if d.zero == 3 else 0.0
    total = states + acts + buffers

    # Time.
    flops = step_flops(_config(shape, s), global_batch, seq_len=s, recompute=d.recompute)
    world = cluster.world_size
    compute = flops["hardware"] / world / (cluster.peak_flops * efficiency)
    m = d.micro_batches
    tp_mb, cp_mb, pp_mb = micro_batch_comm(
        d, cluster, b=b, s_local=s_local, hidden=h, layers=layers, elem_bytes=elem_bytes,
        all_reduces=layers * (6 if d.recompute == "full" else 4))
    slot = compute / m + tp_mb + cp_mb + pp_mb
    pipeline = (m + d.pp - 1) * slot
    dp_comm = _dp_time(params, recipe, d, cluster)
    step = pipeline + dp_comm
    return Prediction(
        states=states, activations=acts, buffers=buffers,
        fits=total <= (1 - headroom) * cluster.memory_bytes,
        compute=compute, tp_comm=m * tp_mb, cp_comm=m * cp_mb, pp_comm=m * pp_mb,
        bubble=(d.pp - 1) * slot, bubble_fraction=bubble_fraction("1f1b", p=d.pp, m=m),
        dp_comm=dp_comm, step=step, model_flops=flops["model"],
        mfu=flops["model"] / (step * world * cluster.peak_flops),
        hfu=flops["hardware"] / (step * world * cluster.peak_flops),
        tokens_per_s=global_batch * s / step)


def _headroom(headroom: float | None) -> float:
    """`headroom`, checked, or `MEMORY_HEADROOM` when None."""
    if headroom is None:
        return MEMORY_HEADROOM
    if not 0 <= headroom < 1:
        raise ValueError(f"predict: headroom must be in [0, 1), got {headroom!r}")
    return headroom


def _dp_time(params: float, recipe: Recipe, d: Layout, cluster: Cluster) -> float:
    """Seconds of the data-parallel exchange of this GPU's `params` over the dp·cp ranks."""
    return exchange_time(params, recipe, zero=d.zero, ranks=d.dp * d.cp,
                         link=cluster.link(d.span("dp")))


def divisors(n: int) -> list[int]:
    """The positive divisors of n, increasing."""
    return [k for k in range(1, n + 1) if n % k == 0]


def layouts(shape: ModelShape, cluster: Cluster, *, global_batch: int, seq_len: int,
            zero_stages=(0, 1, 2, 3), micro_batches=None, recompute=("none", "full"),
            cp=(1,), attention=("materialised",)) -> list[Layout]:
    """Every layout worth predicting: tp inside a node dividing the heads, pp dividing the
    layers, cp dividing the sequence, dp the rest of the world, m micro-batches with B divisible
    by dp·m (every such m when `micro_batches` is None, else those listed); each with every
    ZeRO stage, recompute policy and attention kind given."""
    world, out = cluster.world_size, []
    tps = [t for t in divisors(cluster.gpus_per_node) if shape.heads % t == 0]
    for tp, pp, c in itertools.product(tps, divisors(shape.layers), cp):
        if world % (tp * pp * c) or seq_len % c:
            continue
        dp = world // (tp * pp * c)
        if global_batch % dp:
            continue
        ms = divisors(global_batch // dp) if micro_batches is None else micro_batches
        for m, z, rc, att in itertools.product(ms, zero_stages, recompute, attention):
            if global_batch % (dp * m) == 0 and not (z > 0 and dp * c == 1):
                out.append(Layout(dp=dp, tp=tp, pp=pp, cp=c, zero=z, micro_batches=m,
                                  recompute=rc, attention=att))
    return out


def plan(model: ModelShape | GPTConfig | str, cluster: Cluster, *, global_batch: int,
         seq_len: int | None = None, recipe: Recipe = MIXED_ADAM,
         efficiency: float = EFFICIENCY, elem_bytes: int = 2, headroom: float | None = None,
         **choices) -> pd.DataFrame:
    """Predict every layout of `layouts` (keyword `choices` narrow it: zero_stages,
    micro_batches, recompute, cp, attention) and rank them: layouts that fit (`headroom` of
    every GPU left free, as in `predict`) first, fastest
    first, equal times broken toward the simpler layout (lower ZeRO stage, fewer micro-batches,
    less recomputation, materialised attention).

    One row per layout: its degrees, micro-batch size b, memory parts in GiB, the time parts in
    seconds, step time, MFU, HFU and tokens/s; `layout` holds the `Layout` itself.
    """
    shape = as_shape(model)
    s = shape.seq_len if seq_len is None else seq_len
    rows = []
    for d in layouts(shape, cluster, global_batch=global_batch, seq_len=s, **choices):
        p = predict(shape, cluster, d, global_batch=global_batch, seq_len=s, recipe=recipe,
                    efficiency=efficiency, elem_bytes=elem_bytes, headroom=headroom)
        rows.append(plan_row(d, p, global_batch))
    if not rows:
        raise ValueError(f"plan: no layout of {shape.name} fits the constraints on "
                         f"{cluster.world_size} GPUs with global_batch={global_batch}")
    return rank_plans(pd.DataFrame(rows))


def plan_row(d: Layout, p: Prediction, global_batch: int) -> dict:
    """One row of a plan table: the layout's degrees, b, memory parts in GiB, time parts in
    seconds, step, MFU, HFU, tokens/s, and the `Layout` itself."""
    fields = asdict(p)
    return {"config": d.label(), "dp": d.dp, "tp": d.tp, "pp": d.pp, "cp": d.cp,
            "zero": d.zero, "m": d.micro_batches,
            "b": global_batch // (d.dp * d.micro_batches), "recompute": d.recompute,
            "attention": d.attention,
            **{f"{k}_GiB": fields[k] / GiB for k in ("states", "activations", "buffers")},
            "memory_GiB": p.memory / GiB, "fits": p.fits,
            **{k: fields[k] for k in ("compute", "tp_comm", "cp_comm", "pp_comm", "bubble",
                                      "dp_comm", "step", "bubble_fraction", "mfu", "hfu",
                                      "tokens_per_s")},
            "layout": d}


def rank_plans(table: pd.DataFrame) -> pd.DataFrame:
    """Layouts that fit first, fastest first; equal times go to the simpler layout."""
    # Equal times (ZeRO 0-2 move the same bytes; micro-batches cost nothing extra at pp = 1 in
    # this model, though small ones run less efficiently on a real GPU) go to the simpler
    # layout: lower ZeRO stage, fewer micro-batches, less recomputation, plain attention. Times
    # are compared to 9 significant digits so that float rounding does not decide.
    key = table.assign(_t=table.step.map(lambda t: float(f"{t:.9g}")),
                       _rc=table.recompute.map(RECOMPUTE.index),
                       _fa=table.attention.map(ATTENTION.index))
    order = key.sort_values(["fits", "_t", "zero", "m", "_rc", "_fa"],
                            ascending=[False, True, True, True, True, True], kind="stable").index
    return table.loc[order].reset_index(drop=True)
