"""Expert parallelism: each rank of a group holds E/ep experts and a copy of the router; tokens
travel to their experts and back by all-to-all (GShard, Lepikhin et al., 2020, §3.2; Switch
Transformers, Fedus et al., 2022, §2.2 and Figure 3 / appendix on expert and data parallelism).

    moe = MoELayer(d, f, E, top_k=2, capacity_factor=1.25)   # the same seed on every rank
    ep = ExpertParallelMoE.from_dense(moe, group=ep_group)    # rank r keeps experts r·E/ep …
    out = ep(x_mine)                                          # this rank's tokens, (T_r, d)
    (share_of_loss(out.y) + alpha * out.aux_loss / groups).backward()
    reduce_gradients(ep, expert_group=edp_group, dense_group=world)

Gradients. Expert e's gradient already holds every token routed to it from the ep group (the
all-to-all's backward brought them back), so with ep alone it needs no reduction. The router is
replicated and sees only its rank's tokens: its gradient is summed over every rank that holds a
copy. With data parallelism beside (a Layout's "edp" groups: ranks holding the same experts in
different ep groups), expert gradients are summed over the edp group only, non-expert ones over
all data-parallel ranks. Sums, not means: each rank's loss must be its share of the global loss
(divided by the global token count), so that the sum of the ranks' gradients is the gradient of
the whole batch. Then ExpertParallelMoE on p ranks equals `MoELayer(x, group_sizes=[T_0, …])` on
one process: outputs, gradients, router statistics.

The routers of 2024-25 carry over unchanged (`layer.py`): shared experts are replicated like
the router (dense parameters, summed over the data-parallel ranks); the balancing bias is a
buffer every rank moves with the same all-reduced load (`balance.balance_step`); node-limited
routing counts a node as `nodes` equal blocks of consecutive ranks of the ep group.
"""

from __future__ import annotations

import copy
from typing import Any, Iterable

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..planner.layout import Layout
from .exchange import METHODS, group_info
from .experts import Experts, SharedExperts
from .layer import MoELayer, MoEOutput, moe_forward

__all__ = ["ExpertParallelMoE", "dense_parameters", "expert_parameters", "expert_process_groups",
           "reduce_gradients"]


class ExpertParallelMoE(nn.Module):
    """This rank's part of an MoE layer: the router (replicated) and experts
    [r·E/ep, (r+1)·E/ep) of the group's rank r. `forward(x)` routes this rank's tokens (one
    group), dispatches, runs the local experts, combines; returns an `MoEOutput` whose aux loss
    and statistics are this rank's group's."""

    def __init__(self, router: nn.Linear, experts: Experts, *, num_experts: int, top_k: int,
                 capacity_factor: float | None, group: Any, pad: bool = False,
                 method: str = "all_to_all_single", shared: SharedExperts | None = None,
                 expert_bias: Tensor | None = None, routing: dict | None = None) -> None:
        super().__init__()
        if method not in METHODS:
            raise ValueError(f"ExpertParallelMoE: method must be one of {METHODS}, "
                             f"got {method!r}")
        if router.out_features != num_experts:
            raise ValueError(f"ExpertParallelMoE: the router scores {router.out_features} "
                             f"experts, expected num_experts={num_experts}")
        self.router, self.experts = router, experts
        self.num_experts, self.top_k, self.capacity_factor = num_experts, top_k, capacity_factor
        self.group, self.pad, self.method = group, bool(pad), method
        self.shared, self.routing = shared, dict(routing or {})
        self.register_buffer("expert_bias", expert_bias)

    @classmethod
    def from_dense(cls, moe: MoELayer, *, group: Any = None, pad: bool | None = None,
                   method: str = "all_to_all_single") -> "ExpertParallelMoE":
        """This rank's part of `moe` (built with the same seed on every rank): a copy of the
        router and of experts [r·E/ep, (r+1)·E/ep). `group`: the expert-parallel group (None:
        every rank); `pad`: as `moe` unless given."""
        group = dist.group.WORLD if group is None else group
        me, p = group_info(group)
        if moe.num_experts % p:
            raise ValueError(f"ExpertParallelMoE: {moe.num_experts} experts cannot be shared by "
                             f"an expert-parallel group of {p} ranks; choose ep dividing E")
        local = moe.num_experts // p
        bias = None if moe.expert_bias is None else moe.expert_bias.clone()
        return cls(copy.deepcopy(moe.router), moe.experts.slice(me * local, local),
                   num_experts=moe.num_experts, top_k=moe.top_k,
                   capacity_factor=moe.capacity_factor, group=group,
                   pad=moe.pad if pad is None else pad, method=method,
                   shared=copy.deepcopy(moe.shared), expert_bias=bias, routing=moe.routing)

    def forward(self, x: Tensor) -> MoEOutput:
        flat = x.reshape(-1, x.shape[-1])
        out = moe_forward(flat, self.router, self.experts, top_k=self.top_k,
                          capacity_factor=self.capacity_factor, group=self.group, pad=self.pad,
                          method=self.method, shared=self.shared, bias=self.expert_bias,
                          routing=self.routing)
        out.y = out.y.view_as(x)
        return out


def expert_parameters(module: nn.Module) -> list[nn.Parameter]:
    """Parameters of the `Experts` banks inside `module` (sharded over ep)."""
    return [p for m in module.modules() if isinstance(m, Experts) for p in m.parameters()]


def dense_parameters(module: nn.Module) -> list[nn.Parameter]:
    """Every other parameter of `module` (replicated on every rank)."""
    experts = {id(p) for p in expert_parameters(module)}
    return [p for p in module.parameters() if id(p) not in experts]


def _sum_gradients(params: Iterable[nn.Parameter], group: Any) -> None:
    params = [p for p in params if p.requires_grad]
    if not params:
        return
    # One flat all-reduce per kind; a parameter without a gradient contributes zeros, so that
    # every rank passes the same sizes.
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for p in params])
    dist.all_reduce(flat, group=group)
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset:offset + n].view_as(p).clone()
        offset += n


def reduce_gradients(module: nn.Module, *, expert_group: Any = None,
                     dense_group: Any = None) -> None:
    """Sum gradients where copies live (module docstring): expert parameters over
    `expert_group` (the edp group; None: no other rank holds these experts), the others over
    `dense_group` (None: every rank). One all-reduce per kind."""
    if expert_group is not None:
        _sum_gradients(expert_parameters(module), expert_group)
    _sum_gradients(dense_parameters(module), dist.group.WORLD if dense_group is None
                   else dense_group)


def expert_process_groups(layout: Layout) -> dict[str, Any]:
    """The process groups this rank belongs to for `layout` (`planner.Layout` with ep): "ep"
    (exchange tokens), "edp" (sum expert gradients) and "dp" (sum the dense ones over the
    dp·cp ranks, tp = cp = pp = 1 here). Every rank must call it: torch creates groups
    collectively, all of them in the same order."""
    layout.check(dist.get_world_size())
    if layout.tp * layout.cp * layout.pp != 1:
        raise ValueError(f"expert_process_groups: this course runs ep × edp grids of data-"
                         f"parallel ranks (tp = cp = pp = 1), got {layout.label()}")
    me, out = dist.get_rank(), {}
    for axis in ("ep", "edp", "dp"):
        for ranks in layout.groups(axis):
            group = dist.new_group(ranks)
            if me in ranks:
                out[axis] = group
    return out
