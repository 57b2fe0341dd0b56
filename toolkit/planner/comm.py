"""The planner's communication terms, shared by dense (`plan.predict`) and MoE
(`experts.predict_moe`) predictions: α-β times (`toolkit.cost.predict`, ring collectives) of a
micro-batch's tensor-, context- and pipeline-parallel traffic, and of the gradient exchange over
the ranks that hold copies of some parameters (ZeRO §7's volumes). Formulas and sources: the
docstring of `toolkit.planner.plan`.
"""

from __future__ import annotations

from .. import cost
from ..memory import Recipe
from .cluster import Cluster
from .layout import Layout

__all__ = ["exchange_time", "micro_batch_comm"]


def micro_batch_comm(d: Layout, cluster: Cluster, *, b: int, s_local: int, hidden: int,
                     layers: int, elem_bytes: int, all_reduces: float) -> tuple[float, ...]:
    """Seconds of one micro-batch's (tp, cp, pp) communication on a stage of `layers` layers:
    `all_reduces` tensor-parallel all-reduces of one (b, s/cp, h) activation, ring attention's
    3(cp − 1) key/value passes per layer, and the pipeline's activation out and gradient back
    (module docstring)."""
    h, tp_mb, cp_mb, pp_mb = hidden, 0.0, 0.0, 0.0
    if d.tp > 1:
        n = b * s_local * h * elem_bytes  # one (b, s/cp, h) activation
        tp_mb = all_reduces * float(cost.predict("all_reduce", "ring", n, d.tp,
                                                 cluster.link(d.span("tp"))))
    if d.cp > 1:  # forward passes cp−1 key/value blocks; backward passes them and their grads
        link = cluster.link(d.span("cp"))
        kv = 2 * b * s_local * h / d.tp * elem_bytes
        cp_mb = layers * 3 * (d.cp - 1) * (link.alpha + kv * link.beta)
    if d.pp > 1:  # Megatron's scatter/gather: each tp rank sends 1/tp of the activation
        link = cluster.link(d.span("pp"))
        pp_mb = 2 * (link.alpha + b * s_local * h / d.tp * elem_bytes * link.beta)
    return tp_mb, cp_mb, pp_mb


def exchange_time(params: float, recipe: Recipe, *, zero: int, ranks: int,
                  link: cost.AlphaBeta) -> float:
    """Seconds to exchange the gradients (and ZeRO's parameters) of `params` over `ranks`
    holding copies (ZeRO §7's volumes, ring collectives): ZeRO 0 all-reduce, 1-2 reduce-scatter
    + all-gather, 3 two all-gathers + reduce-scatter."""
    if ranks == 1:
        return 0.0
    grads, weights = params * recipe.grad_bytes, params * recipe.param_bytes

    def t(collective: str, nbytes: float) -> float:
        return float(cost.predict(collective, "ring", nbytes, ranks, link))

    if zero == 0:
        return t("all_reduce", grads)
    if zero in (1, 2):
        return t("reduce_scatter", grads) + t("all_gather", weights)
    return 2 * t("all_gather", weights) + t("reduce_scatter", grads)
