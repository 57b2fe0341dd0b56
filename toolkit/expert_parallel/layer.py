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

Shapes: x (..., d) → y (..., d); tokens are the rows of x.reshape(-1, d).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor, nn

from ..arguments import check_int
from .dispatch import combine, dispatch
from .experts import Experts, uniform_
from .router import load_balancing_loss, route
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


def moe_forward(x: Tensor, router: nn.Linear, experts: Experts, *, top_k: int,
                capacity_factor: float | None, group: Any = None, pad: bool = False,
                method: str = "all_to_all_single") -> MoEOutput:
    """One group's tokens x (T, d) through route → dispatch → experts → combine. `experts`
    must hold this rank's experts (all of them when `group` is None)."""
    routing = route(router(x), top_k=top_k, capacity_factor=capacity_factor)
    sent = dispatch(x, routing, group=group, pad=pad, method=method)
    if experts.first != sent.first_expert or experts.num_experts != len(sent.counts):
        raise ValueError(f"moe_forward: this rank must hold experts {sent.first_expert}.."
                         f"{sent.first_expert + len(sent.counts) - 1}, its bank holds "
                         f"{experts.first}..{experts.first + experts.num_experts - 1}")
    y = combine(experts(sent.rows, sent.counts), sent)
    return MoEOutput(y.to(x.dtype), load_balancing_loss(routing), router_stats(routing))


class MoELayer(nn.Module):
    """Router + `num_experts` experts d → d_ff → d on one process (module docstring).

    `top_k` experts per token; `capacity_factor` cf (None: no token dropped); `pad`: compute on
    padded E × C buffers (GShard/Switch) instead of the kept rows only (same output, more FLOPs).
    Weights come from a CPU generator seeded with `seed`, so every process builds the same layer.
    """

    def __init__(self, d_model: int, d_ff: int, num_experts: int, *, top_k: int = 1,
                 capacity_factor: float | None = 1.25, pad: bool = False, seed: int = 0,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None
                 ) -> None:
        super().__init__()
        check_int("MoELayer", "d_model", d_model)
        check_int("MoELayer", "num_experts", num_experts)
        check_int("MoELayer", "top_k", top_k, high=num_experts, hint="experts per token")
        self.top_k, self.capacity_factor, self.pad = top_k, capacity_factor, bool(pad)
        generator = torch.Generator().manual_seed(seed)
        self.router = nn.Linear(d_model, num_experts, bias=False, device=device, dtype=dtype)
        uniform_(self.router.weight, d_model, generator)
        self.experts = Experts(num_experts, d_model, d_ff, device=device, dtype=dtype,
                               generator=generator)

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
                            capacity_factor=self.capacity_factor, pad=self.pad)
                for chunk in flat.split(sizes)]
        y = torch.cat([o.y for o in outs]).view_as(x)
        aux = torch.stack([o.aux_loss for o in outs]).mean()
        return MoEOutput(y, aux, merge([o.stats for o in outs]))

    def extra_repr(self) -> str:
        return f"top_k={self.top_k}, capacity_factor={self.capacity_factor}, pad={self.pad}"

