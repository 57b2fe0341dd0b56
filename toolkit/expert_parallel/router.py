"""The router: top-k experts per token, their gates, a slot in each expert's queue, and the
load-balancing loss.

Gating (Shazeer et al., 2017, "Outrageously Large Neural Networks", §2.1; Switch Transformers,
Fedus et al., 2022, §2.1; GShard, Lepikhin et al., 2020, §2.2, Algorithm 1):

    p_t = softmax(x_t · W_r)                      (T, E) router probabilities
    e_t,1 … e_t,k = the k largest p_t,e            choices, best first
    g_t,j = p_t,e_t,j                              k = 1 (Switch: y = p_i(x)·E_i(x))
    g_t,j = p_t,e_t,j / Σ_i p_t,e_t,i              k > 1 (GShard's g1/(g1 + g2); Mixtral's
                                                   softmax over the top-k logits is the same)

Slots: each expert takes the group's choices in order, every token's first choice before any
second choice (GShard, Algorithm 1: the second expert's positions start after the first's), so
slot_t,j = number of earlier choices of e_t,j in that order. A choice is kept when its slot is
below the capacity C (`toolkit.cost.experts.expert_capacity`). GShard's random dispatch of the
second choice (kept with probability ∝ g2) is left out: routing here is deterministic, so a
single-process layer and its expert-parallel version can be compared exactly.

Load-balancing loss (Switch Transformers, §2.2, eq. 4-6):

    loss = E · Σ_i f_i · P_i,   f_i = fraction of the group's tokens whose first choice is i,
                                P_i = mean router probability of expert i over the group

equal to 1 when routing is uniform and up to E when it collapses onto one expert; f carries no
gradient, P does. Switch multiplies it by α = 10⁻² (§2.2); GShard's (1/E)·Σ_e (c_e/S)·m_e is the
same up to the constant E² (§2.2). Computed per group (per rank) as both papers do.

Shapes: x (T, d) → logits (T, E); expert, gate, slot, kept (T, k).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..arguments import check_int
from ..cost.experts import expert_capacity

__all__ = ["Routing", "load_balancing_loss", "route", "slots"]


@dataclass
class Routing:
    """Where one group's tokens go (module docstring for the math)."""

    probs: Tensor
    """(T, E) router probabilities (differentiable)."""
    expert: Tensor
    """(T, k) int64: chosen experts, best first."""
    gate: Tensor
    """(T, k): weights of the chosen experts' outputs (differentiable)."""
    slot: Tensor
    """(T, k) int64: position of the choice in its expert's queue within the group."""
    kept: Tensor
    """(T, k) bool: slot < capacity."""
    capacity: int
    """C: slots per expert for this group."""

    @property
    def num_experts(self) -> int:
        return self.probs.shape[1]

    @property
    def top_k(self) -> int:
        return self.expert.shape[1]

    @property
    def tokens(self) -> int:
        return self.probs.shape[0]

    def load(self) -> Tensor:
        """(E,) int64: choices per expert before the capacity cut."""
        return torch.bincount(self.expert.reshape(-1), minlength=self.num_experts)

    def kept_load(self) -> Tensor:
        """(E,) int64: choices per expert that got a slot."""
        return torch.bincount(self.expert[self.kept], minlength=self.num_experts)


def slots(expert: Tensor, num_experts: int) -> Tensor:
    """(T, k) queue positions: choices ordered by rank j first, then token (GShard's priority)."""
    tokens, k = expert.shape
    onehot = F.one_hot(expert.t().reshape(-1), num_experts)  # (k·T, E), row j·T + t
    position = (onehot.cumsum(0) - 1) * onehot                # earlier choices of that expert
    return position.sum(1).view(k, tokens).t().contiguous()


def route(logits: Tensor, *, top_k: int = 1, capacity_factor: float | None = 1.0) -> Routing:
    """Top-k routing of one group's tokens with capacity ⌈cf·k·T/E⌉ (`capacity_factor=None`:
    no limit). `logits`: (T, E), the router's x·W_r; probabilities are taken in float32 at least
    (Switch §2.4 keeps the router in float32 for stability)."""
    if logits.dim() != 2:
        raise ValueError(f"route: logits must be (tokens, experts), got shape "
                         f"{tuple(logits.shape)}")
    tokens, num_experts = logits.shape
    check_int("route", "top_k", top_k, high=num_experts, hint="experts per token")
    capacity = expert_capacity(tokens, num_experts, top_k=top_k, capacity_factor=capacity_factor)
    dtype = torch.promote_types(logits.dtype, torch.float32)
    probs = torch.softmax(logits.to(dtype), dim=-1)
    top, expert = probs.topk(top_k, dim=-1)
    gate = top if top_k == 1 else top / top.sum(-1, keepdim=True)
    slot = slots(expert, num_experts)
    return Routing(probs=probs, expert=expert, gate=gate, slot=slot, kept=slot < capacity,
                   capacity=capacity)


def load_balancing_loss(routing: Routing) -> Tensor:
    """Switch's E · Σ_i f_i · P_i for this group (0 for a group without tokens)."""
    if routing.tokens == 0:
        return routing.probs.sum()  # a zero that keeps the graph: every rank runs backward
    first = torch.bincount(routing.expert[:, 0], minlength=routing.num_experts)
    f = first.to(routing.probs.dtype) / routing.tokens
    p = routing.probs.mean(0)
    return routing.num_experts * (f * p).sum()
