"""The planner's expert-parallel axis: memory and step time of an MoE model under a layout with
ep, and plans ranked over ep as well as dp, tp, pp, cp.

The MoE layers lay each pipeline stage's tp·cp·dp ranks out as ep × edp (`Layout`, MoE parallel
folding): rank r holds E/ep whole experts of each MoE layer, routes its own b·s/(cp·tp) tokens
(sequence parallelism splits them over tp, so tp > 1 needs it) and exchanges them with its ep
group. Terms that differ from the dense model (`plan.py`, whose docstring has the rest):

    states    non-expert parameters of the stage / tp, ZeRO over dp·cp (as dense)
              + moe_layers_stage · (E/ep) · m·h·f expert parameters, ZeRO over the edp ranks
    acts      Korthikanti's layer; an MoE layer swaps its MLP's two 4h-wide tensors
              (16·b·s·h/(cp·tp) bytes) for the experts': per routed row (k·cf rows per token)
              the dispatched input and the returned output (2·2h bytes) and the expert's
              f-wide tensors (GELU: input, output, 2·2f; SwiGLU: gate, up, SiLU, product, 4·2f)
    compute   6·N_active + 12·L·h·s per token, experts at cf·k rows per token
              (`MoEShape.flops_per_token`)
    tp        per micro-batch 4 all-reduces per dense layer, 2 per MoE layer (the experts are
              not split over tp), + 2 and + 1 with full recomputation
    ep        per micro-batch and MoE layer 4 all-to-alls (dispatch, combine, and their
              gradients; 6 with full recomputation) of n = k·cf·(b·s/(cp·tp))·h·elem_bytes
              bytes each, t = (ep − 1)·α + (ep − 1)/ep·n·β over the ep group's link
              (`toolkit.cost.experts`, pairwise all-to-all of Thakur et al. 2005)
    dp        the dense exchange over dp·cp + the experts' over the edp ranks

Router activations (T·E numbers) and the counts exchanged before each dispatch are left out.
Balanced routing is assumed: a skewed router makes the busiest rank's all-to-all and experts
slower (lesson 13's explorer), which this model does not see.

**Fits** means memory ≤ (1 − headroom) · the GPU's memory: `MEMORY_HEADROOM` of every GPU is kept
for what the model does not count (allocator fragmentation, communication buffers, the CUDA
context, kernels' workspaces). Memory is in bytes, shown in GiB (2³⁰ bytes; an "80 GB" H100
holds 80 GiB).

**Folding** (`folded_groups`): Megatron-Core's MoE parallel folding (Liu et al., 2025,
arXiv:2504.14960) lets the MoE layers use their own grid over the same ranks: the attention
layers see tp × cp × dp per stage, the MoE layers etp × ep × edp (etp: expert tensor
parallelism, each expert's matrices split over etp ranks; etp fastest, then ep), with

    tp · cp · dp = etp · ep · edp,   i.e.   edp = world / (ep · etp · pp)

so ep may be larger than dp (it folds over tp and cp ranks as well), and the all-to-all of a
small ep stays among neighbouring ranks (inside a node). `Layout`'s "ep" and "edp" groups are
the case etp = 1.
"""

from __future__ import annotations

import dataclasses

import pandas as pd

from .. import cost
from ..arguments import check_ints, is_number
from ..cost.bubble import bubble_fraction, peak_activations
from ..memory import GiB, MIXED_ADAM, Recipe, activation_bytes_per_layer, model_state_bytes
from .cluster import Cluster
from .comm import exchange_time, micro_batch_comm
from .layout import Layout
from .moe_shapes import MoEShape, moe_shape
from .plan import EFFICIENCY, Prediction, divisors, layouts, plan_row, rank_plans

__all__ = ["MEMORY_HEADROOM", "folded_groups", "layouts_moe", "plan_moe", "predict_moe"]

MEMORY_HEADROOM = 0.10
"""Share of every GPU's memory a plan leaves free (module docstring). An assumption of this
course, not a measurement: ZeRO (Rajbhandari et al., 2020, §3.2) saw fragmentation alone leave
over 30 % of memory unusable in extreme cases; 10 % is a margin, not a guarantee."""


def _as_moe(model: MoEShape | str) -> MoEShape:
    if isinstance(model, MoEShape):
        return model
    if isinstance(model, str):
        return moe_shape(model)
    raise TypeError(f"predict_moe: model must be an MoEShape or a name in MOE_MODELS, got "
                    f"{type(model).__name__}")


def folded_groups(layout: Layout, *, etp: int = 1) -> dict[str, list[list[int]]]:
    """The MoE layers' groups "etp", "ep" and "edp" when each pipeline stage's tp·cp·dp ranks
    are laid out again as etp × ep × edp, etp fastest (module docstring); each list sorted as
    `Layout.groups` sorts. With etp = 1, "ep" and "edp" are `layout.groups`' own."""
    check_ints("folded_groups", etp=etp)
    n, ep = layout.stage_size, layout.ep
    if n % (ep * etp):
        raise ValueError(f"folded_groups: ep × etp = {ep} × {etp} must divide the "
                         f"{n} ranks of a stage (tp × cp × dp of {layout.label()})")
    edp = n // (ep * etp)
    out: dict[str, list[list[int]]] = {"etp": [], "ep": [], "edp": []}
    for stage in range(layout.pp):
        def rank(i_etp: int, i_ep: int, i_edp: int, base: int = stage * n) -> int:
            return base + (i_edp * ep + i_ep) * etp + i_etp
        out["etp"] += [[rank(i, j, k) for i in range(etp)] for j in range(ep)
                       for k in range(edp)]
        out["ep"] += [[rank(i, j, k) for j in range(ep)] for i in range(etp)
                      for k in range(edp)]
        out["edp"] += [[rank(i, j, k) for k in range(edp)] for i in range(etp)
                       for j in range(ep)]
    return {axis: sorted(groups) for axis, groups in out.items()}


def _check(shape: MoEShape, d: Layout, s: int, global_batch: int, cf: float) -> None:
    for what, n, k in (("heads", shape.heads, d.tp), ("layers", shape.layers, d.pp),
                       ("seq_len", s, d.cp), ("num_experts", shape.num_experts, d.ep),
                       ("global_batch", global_batch, d.dp * d.micro_batches)):
        if n % k:
            raise ValueError(f"predict_moe: {what}={n} is not divisible by {k} "
                             f"({d.label()}); choose degrees that divide it")
    if d.tp > 1 and not d.sequence_parallel:
        raise ValueError("predict_moe: tp > 1 needs sequence_parallel=True: each tp rank "
                         "routes its own s/tp tokens (else all tp ranks send the same tokens)")
    if not is_number(cf) or cf < 1:
        raise ValueError(f"predict_moe: capacity_factor must be a number >= 1 (rows per "
                         f"routed token; 1: balanced or dropless), got {cf!r}")


def predict_moe(model: MoEShape | str, cluster: Cluster, layout: Layout, *, global_batch: int,
                seq_len: int | None = None, recipe: Recipe = MIXED_ADAM,
                efficiency: float = EFFICIENCY, elem_bytes: int = 2,
                capacity_factor: float = 1.0, headroom: float = MEMORY_HEADROOM) -> Prediction:
    """Memory per GPU and step time of an MoE model under `layout` (with ep) on `cluster`
    (module docstring); `capacity_factor` cf scales the expert rows each token costs in
    compute, activations and all-to-all bytes (padded buffers); the plan fits when its memory
    is at most (1 − `headroom`) of the GPU's. Arguments as `plan.predict`."""
    shape = _as_moe(model)
    s = shape.seq_len if seq_len is None else seq_len
    d = layout.check(cluster.world_size)
    check_ints("predict_moe", global_batch=global_batch, seq_len=s)
    if not 0 < efficiency <= 1:
        raise ValueError(f"predict_moe: efficiency must be in (0, 1], got {efficiency!r}")
    if not is_number(headroom) or not 0 <= headroom < 1:
        raise ValueError(f"predict_moe: headroom must be a share of memory in [0, 1) kept "
                         f"free, got {headroom!r}")
    _check(shape, d, s, global_batch, capacity_factor)
    b, m = global_batch // (d.dp * d.micro_batches), d.micro_batches
    s_local, layers = s // d.cp, shape.layers // d.pp
    moe_layers = layers // shape.moe_every  # MoE layers of the first stage
    dense_layers = layers - moe_layers
    h, k, cf = shape.hidden, shape.top_k, capacity_factor
    sp = d.sequence_parallel and d.tp > 1

    # States of the first stage: non-expert parameters (tp-split, ZeRO over dp·cp) and experts.
    nonexpert = (dense_layers * shape.layer_params(moe=False)
                 + moe_layers * shape.layer_params(moe=True, experts=0)
                 + (shape.outside_layers if d.pp == 1 else shape.outside_layers
                    - (0 if shape.tied else shape.vocab * h) - h))
    expert_params = moe_layers * shape.num_experts // d.ep * shape.expert_params
    dense_states = model_state_bytes(nonexpert / d.tp, d.dp * d.cp, d.zero, recipe).total
    expert_states = model_state_bytes(expert_params, d.edp, d.zero, recipe).total

    # Activations: Korthikanti's layer, the MLP's 4h-wide tensors swapped for the experts'.
    act_kw = dict(seq_len=s, batch=b, hidden=h, heads=shape.heads, tensor_parallel=d.tp,
                  sequence_parallel=sp, context_parallel=d.cp, attention=d.attention)
    per_layer = activation_bytes_per_layer(**act_kw, recompute=d.recompute)
    plain = activation_bytes_per_layer(**act_kw, recompute="none")
    tokens = b * s_local / d.tp  # routed by this rank per micro-batch
    rows = k * cf * tokens
    swap = rows * (4 * h + (8 if shape.gated else 4) * shape.expert_ffn) - 16 * tokens * h
    in_flight = peak_activations("1f1b", p=d.pp, m=m)
    kept_moe = per_layer + (swap if d.recompute != "full" else 0.0)
    acts = (dense_layers * per_layer + moe_layers * kept_moe) * in_flight
    if d.recompute == "full":  # the rerun layer's internals come back (an MoE layer's if any)
        acts += plain + (swap if moe_layers else 0.0)
    elif d.recompute == "selective":
        acts += plain - per_layer
    biggest = max(shape.layer_params(moe=False) if dense_layers else 0,
                  shape.layer_params(moe=True, experts=0) if moe_layers else 0) / d.tp
    if moe_layers:
        biggest += shape.num_experts // d.ep * shape.expert_params
    buffers = 2 * biggest * recipe.param_bytes if d.zero == 3 else 0.0
    states = dense_states + expert_states
    total = states + acts + buffers

    # Time.
    world, n_tokens = cluster.world_size, global_batch * s
    model_flops = shape.flops_per_token(seq_len=s) * n_tokens
    extra = 4 * shape.layers * h * s  # selective: the attention core again
    if d.recompute == "full":  # every layer's forward again (not the head)
        extra += 2 * (shape.matmul_params(capacity_factor=cf) - shape.vocab * h)
    hardware = (shape.flops_per_token(seq_len=s, capacity_factor=cf)
                + (extra if d.recompute != "none" else 0.0)) * n_tokens
    compute = hardware / world / (cluster.peak_flops * efficiency)
    full = d.recompute == "full"
    tp_mb, cp_mb, pp_mb = micro_batch_comm(
        d, cluster, b=b, s_local=s_local, hidden=h, layers=layers, elem_bytes=elem_bytes,
        all_reduces=dense_layers * (6 if full else 4) + moe_layers * (3 if full else 2))
    ep_mb = 0.0
    if d.ep > 1:
        n = rows * h * elem_bytes  # bytes one all-to-all passes in per rank
        one = float(cost.predict("all_to_all", "pairwise", n, d.ep, cluster.link(d.span("ep"))))
        ep_mb = moe_layers * (6 if full else 4) * one
    slot = compute / m + tp_mb + cp_mb + pp_mb + ep_mb
    pipeline = (m + d.pp - 1) * slot
    dp_comm = (exchange_time(nonexpert / d.tp, recipe, zero=d.zero, ranks=d.dp * d.cp,
                             link=cluster.link(d.span("dp")))
               + exchange_time(expert_params, recipe, zero=d.zero, ranks=d.edp,
                               link=cluster.link(d.span("edp"))))
    step = pipeline + dp_comm
    return Prediction(
        states=states, activations=acts, buffers=buffers,
        fits=total <= (1 - headroom) * cluster.memory_bytes,
        compute=compute, tp_comm=m * tp_mb, cp_comm=m * cp_mb, pp_comm=m * pp_mb,
        bubble=(d.pp - 1) * slot, bubble_fraction=bubble_fraction("1f1b", p=d.pp, m=m),
        dp_comm=dp_comm, step=step, model_flops=model_flops,
        mfu=model_flops / (step * world * cluster.peak_flops),
        hfu=hardware / (step * world * cluster.peak_flops),
        tokens_per_s=n_tokens / step, ep_comm=m * ep_mb, expert_states=expert_states)


def layouts_moe(shape: MoEShape, cluster: Cluster, *, global_batch: int, seq_len: int,
                ep: tuple[int, ...] | None = None, **choices) -> list[Layout]:
    """`plan.layouts` (keyword `choices` as there), each with every ep that divides both the
    experts and the stage's tp·cp·dp ranks (those listed in `ep` when given)."""
    out = []
    for d in layouts(shape, cluster, global_batch=global_batch, seq_len=seq_len, **choices):
        for e in divisors(shape.num_experts):
            if d.stage_size % e == 0 and (ep is None or e in ep):
                out.append(dataclasses.replace(d, ep=e))
    return out


def plan_moe(model: MoEShape | str, cluster: Cluster, *, global_batch: int,
             seq_len: int | None = None, recipe: Recipe = MIXED_ADAM,
             efficiency: float = EFFICIENCY, elem_bytes: int = 2, capacity_factor: float = 1.0,
             headroom: float = MEMORY_HEADROOM, **choices) -> pd.DataFrame:
    """`predict_moe` every layout of `layouts_moe` and rank them as `plan.plan` does (fits
    first, fastest first, ties to the simpler layout, then the smaller ep). Columns as
    `plan.plan`'s, plus ep, edp, ep_comm (s) and experts_GiB (the experts' share of states);
    `fits` keeps `headroom` of every GPU free."""
    shape = _as_moe(model)
    s = shape.seq_len if seq_len is None else seq_len
    rows = []
    for d in layouts_moe(shape, cluster, global_batch=global_batch, seq_len=s, **choices):
        p = predict_moe(shape, cluster, d, global_batch=global_batch, seq_len=s, recipe=recipe,
                        efficiency=efficiency, elem_bytes=elem_bytes,
                        capacity_factor=capacity_factor, headroom=headroom)
        rows.append({**plan_row(d, p, global_batch), "ep": d.ep, "edp": d.edp,
                     "ep_comm": p.ep_comm, "experts_GiB": p.expert_states / GiB})
    if not rows:
        raise ValueError(f"plan_moe: no layout of {shape.name} fits the constraints on "
                         f"{cluster.world_size} GPUs with global_batch={global_batch}")
    table = pd.DataFrame(rows).sort_values("ep", kind="stable")  # ties: smaller ep first
    return rank_plans(table.reset_index(drop=True))
