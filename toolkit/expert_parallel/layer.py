"""A mixture-of-experts layer on one process: router, capacity, experts, combine.

    y_t = Σ_{j ≤ k, choice kept} g_t,j · E_{e_t,j}(x_t)          (Shazeer et al. 2017, eq. 1;
                                                               Switch §2.1, GShard §2.2)

with the router of `router.py` (top-k, capacity ⌈cf·k·T/E⌉ per group, Switch's load-balancing
loss) and the experts of `experts.py`. The layer replaces a transformer's MLP; a dropped token
gets y_t = 0, and the block's residual connection carries it on unchanged (Switch §2.2).

Parameters against FLOPs: E experts hold E·(2·d·f + f + d) parameters, E times a dense MLP's,
but a token runs only k of them: forward FLOPs per token 2·d·E (router) + k·4·d·f (experts),
k times a dense MLP's plus the router. A padded buffer computes E·C ≈ cf·k·T rows instead of k·T.

Groups: `group_sizes` splits the T tokens into groups routed independently, each with its own
capacity and load-balancing loss (GShard's "local group dispatching", §2.2); a rank of the
expert-parallel layer is one group, so `MoELayer(x, group_sizes=[T_0, …, T_{p−1}])` on one
process is the reference that `ExpertParallelMoE` on p ranks must equal (outputs, gradients,
statistics). The layer's auxiliary loss is the mean of the groups' losses.

Routers of 2024-25 (`router.py`): ``score="sigmoid"`` (DeepSeek-V3), a balancing bias
(``expert_bias=True``: a buffer b of E zeros that `balance.update_bias` moves; the choice uses
s + b, the gates s), node-limited routing (``nodes``, ``max_nodes``), and ``num_shared`` shared
experts every token runs (DeepSeekMoE, `experts.SharedExperts`). Fine-grained experts
(DeepSeekMoE §3.1) need nothing new: more, narrower experts and a larger k
(`toolkit.cost.experts.fine_grained` gives the shapes). The output also carries ST-MoE's router
z-loss of the logits (`router.router_z_loss`).

Shapes: x (..., d) → y (..., d); tokens are the rows of x.reshape(-1, d).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor, nn

from ..arguments import check_int
from .dispatch import combine, dispatch
from .experts import Experts, SharedExperts, uniform_
from .router import load_balancing_loss, route, router_z_loss
from .stats import RouterStats, merge, router_stats

__all__ = ["MoELayer", "MoEOutput", "moe_forward"]


@dataclass
class MoEOutput:
    """What an MoE layer returns."""

    y: Tensor
    """(..., d): the layer's output (zero rows for dropped tokens)."""
    aux_loss: Tensor
    """Switch's load-balancing loss E·Σ f_i·P_i, mean over groups (multiply by α, ~10⁻²)."""
    stats: RouterStats
    """Tokens per expert, dropped, imbalance, padding (`stats.py`)."""
    z_loss: Tensor | None = None
    """ST-MoE's router z-loss, mean over groups (multiply by c_z, ~10⁻³)."""


def moe_forward(x: Tensor, router: nn.Linear, experts: Experts, *, top_k: int,
                capacity_factor: float | None, group: Any = None, pad: bool = False,
                method: str = "all_to_all_single", shared: SharedExperts | None = None,
                bias: Tensor | None = None, routing: dict | None = None) -> MoEOutput:
    """One group's tokens x (T, d) through route → dispatch → experts → combine (+ the shared
    experts). `experts` must hold this rank's experts (all of them when `group` is None);
    `bias` and `routing` (``score``, ``nodes``, ``max_nodes``) go to `route`."""
    logits = router(x)
    routing_ = route(logits, top_k=top_k, capacity_factor=capacity_factor, bias=bias,
                     **(routing or {}))
    sent = dispatch(x, routing_, group=group, pad=pad, method=method)
    if experts.first != sent.first_expert or experts.num_experts != len(sent.counts):
        raise ValueError(f"moe_forward: this rank must hold experts {sent.first_expert}.."
                         f"{sent.first_expert + len(sent.counts) - 1}, its bank holds "
                         f"{experts.first}..{experts.first + experts.num_experts - 1}")
    y = combine(experts(sent.rows, sent.counts), sent)
    if shared is not None:
        y = y + shared(x)
    return MoEOutput(y.to(x.dtype), load_balancing_loss(routing_), router_stats(routing_),
                     router_z_loss(logits))


class MoELayer(nn.Module):
    """Router + `num_experts` experts d → d_ff → d on one process (module docstring).

    `top_k` experts per token; `capacity_factor` cf (None: no token dropped); `pad`: compute on
    padded E × C buffers (GShard/Switch) instead of the kept rows only (same output, more FLOPs).
    `score`, `expert_bias`, `nodes`, `max_nodes`, `num_shared` (module docstring): the routers
    of 2024-25, off by default. Weights come from a CPU generator seeded with `seed`, so every
    process builds the same layer.
    """

    def __init__(self, d_model: int, d_ff: int, num_experts: int, *, top_k: int = 1,
                 capacity_factor: float | None = 1.25, pad: bool = False, seed: int = 0,
                 score: str = "softmax", expert_bias: bool = False, nodes: int = 1,
                 max_nodes: int | None = None, num_shared: int = 0,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None
                 ) -> None:
        super().__init__()
        check_int("MoELayer", "d_model", d_model)
        check_int("MoELayer", "num_experts", num_experts)
        check_int("MoELayer", "top_k", top_k, high=num_experts, hint="experts per token")
        check_int("MoELayer", "num_shared", num_shared, low=0)
        self.top_k, self.capacity_factor, self.pad = top_k, capacity_factor, bool(pad)
        self.routing = dict(score=score, nodes=nodes, max_nodes=max_nodes)
        generator = torch.Generator().manual_seed(seed)
        self.router = nn.Linear(d_model, num_experts, bias=False, device=device, dtype=dtype)
        uniform_(self.router.weight, d_model, generator)
        self.experts = Experts(num_experts, d_model, d_ff, device=device, dtype=dtype,
                               generator=generator)
        self.shared = (SharedExperts(num_shared, d_model, d_ff, device=device, dtype=dtype,
                                     generator=generator) if num_shared else None)
        # The balancing bias is state, not a parameter: no gradient, moved by update_bias.
        self.register_buffer("expert_bias", torch.zeros(num_experts, dtype=torch.float64,
                                                        device=device) if expert_bias else None)

    @property
    def num_experts(self) -> int:
        return self.experts.num_experts

    def forward(self, x: Tensor, *, group_sizes: Sequence[int] | None = None) -> MoEOutput:
        d = x.shape[-1]
        flat = x.reshape(-1, d)
        sizes = [flat.shape[0]] if group_sizes is None else list(group_sizes)
        if sum(sizes) != flat.shape[0] or any(n < 0 for n in sizes):
            raise ValueError(f"MoELayer: group_sizes must be counts >= 0 adding up to the "
                             f"{flat.shape[0]} tokens, got {sizes}")
        outs = [moe_forward(chunk, self.router, self.experts, top_k=self.top_k,
                            capacity_factor=self.capacity_factor, pad=self.pad,
                            shared=self.shared, bias=self.expert_bias, routing=self.routing)
                for chunk in flat.split(sizes)]
        y = torch.cat([o.y for o in outs]).view_as(x)
        aux = torch.stack([o.aux_loss for o in outs]).mean()
        z = torch.stack([o.z_loss for o in outs]).mean()
        return MoEOutput(y, aux, merge([o.stats for o in outs]), z)

    def extra_repr(self) -> str:
        extra = "".join(f", {k}={v}" for k, v in self.routing.items()
                        if v != {"score": "softmax", "nodes": 1, "max_nodes": None}[k])
        return (f"top_k={self.top_k}, capacity_factor={self.capacity_factor}, pad={self.pad}"
                + extra)

