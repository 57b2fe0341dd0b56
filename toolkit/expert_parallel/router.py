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

Routers of 2024-25 (all optional; the defaults are the router above):

* **Sigmoid scores** (DeepSeek-V3, DeepSeek-AI 2024, arXiv:2412.19437, §2.1.2):
  s_t,e = sigmoid(x_t·w_e), the gates normalised over the k chosen, g_t,j = s_t,e_t,j /
  Σ_i s_t,e_t,i.
* **A balancing bias** (auxiliary-loss-free balancing, Wang et al. 2024, arXiv:2408.15664,
  Algorithm 1; DeepSeek-V3 §2.1.2): a per-expert b_e added to the scores *for the choice
  only*, top-k of s_t,e + b_e, while the gates use s itself; `balance.update_bias` moves b
  between steps.
* **Node-limited routing** (DeepSeek-V3 §2.1.2; DeepSeek-V2's device-limited routing, §2.2.2):
  the E experts sit in `nodes` equal blocks (rank-major, as expert parallelism places them);
  each token first picks at most M = `max_nodes` nodes, by the sum of its ⌈k/M⌉ highest scores
  on each node, then its k experts among those nodes' (`node_limited_mask`). Its rows then leave
  for at most M nodes.
* **Router z-loss** (ST-MoE, Zoph et al. 2022, §3.3, eq. 5): L_z = (1/T)·Σ_t (log Σ_e
  exp(logit_t,e))², weighted c_z = 10⁻³ in the total loss (eq. 6): it keeps the logits small,
  where a 16-bit softmax rounds least (`router_z_loss`). The router itself runs in float32 at
  least whatever the input dtype (Switch §2.4, "selective precision").

Shapes: x (T, d) → logits (T, E); expert, gate, slot, kept (T, k).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..arguments import check_int
from ..cost.experts import expert_capacity

__all__ = ["SCORES", "Routing", "load_balancing_loss", "node_limited_mask", "nodes_touched",
           "route", "router_z_loss", "slots"]

SCORES = ("softmax", "sigmoid")
"""How the router turns logits into scores: softmax over the experts (Switch, GShard,
Mixtral), or an independent sigmoid per expert (DeepSeek-V3)."""


@dataclass
class Routing:
    """Where one group's tokens go (module docstring for the math)."""

    probs: Tensor
    """(T, E) router scores (differentiable): softmax probabilities, or sigmoid affinities."""
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
    score: str = "softmax"
    """How `probs` were made from the logits (`SCORES`)."""

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


def node_limited_mask(scores: Tensor, *, top_k: int, nodes: int, max_nodes: int) -> Tensor:
    """(T, E) bool: the experts each token may choose when its k choices may reach at most
    `max_nodes` of the `nodes` equal, contiguous blocks of experts (DeepSeek-V3 §2.1.2): the
    M nodes with the largest sums of the token's ⌈k/M⌉ best `scores` there."""
    tokens, num_experts = scores.shape
    check_int("node_limited_mask", "nodes", nodes, high=num_experts)
    check_int("node_limited_mask", "max_nodes", max_nodes, high=nodes)
    if num_experts % nodes:
        raise ValueError(f"node_limited_mask: {num_experts} experts cannot be split into "
                         f"{nodes} equal nodes; choose nodes dividing E")
    per_node = num_experts // nodes
    if per_node * max_nodes < top_k:
        raise ValueError(f"node_limited_mask: top_k={top_k} choices do not fit on max_nodes="
                         f"{max_nodes} nodes of {per_node} experts each")
    best = min(-(-top_k // max_nodes), per_node)   # ⌈k/M⌉ scores per node
    node_score = scores.view(tokens, nodes, per_node).topk(best, dim=-1).values.sum(-1)
    chosen = node_score.topk(max_nodes, dim=-1).indices                 # (T, M)
    allowed_nodes = torch.zeros(tokens, nodes, dtype=torch.bool, device=scores.device)
    allowed_nodes.scatter_(1, chosen, True)
    return allowed_nodes.repeat_interleave(per_node, dim=1)             # (T, E)


def nodes_touched(expert: Tensor, *, num_experts: int, nodes: int) -> Tensor:
    """(T,) int64: how many of the `nodes` blocks of experts each token's choices reach."""
    per_node = num_experts // nodes
    hit = torch.zeros(expert.shape[0], nodes, dtype=torch.bool, device=expert.device)
    hit.scatter_(1, expert // per_node, True)
    return hit.sum(1)


def route(logits: Tensor, *, top_k: int = 1, capacity_factor: float | None = 1.0,
          score: str = "softmax", bias: Tensor | None = None, nodes: int = 1,
          max_nodes: int | None = None) -> Routing:
    """Top-k routing of one group's tokens with capacity ⌈cf·k·T/E⌉ (`capacity_factor=None`:
    no limit). `logits`: (T, E), the router's x·W_r; scores are taken in float32 at least
    (Switch §2.4 keeps the router in float32 for stability). `score`: "softmax" or "sigmoid";
    `bias` (E,): added to the scores for the choice only (no gradient); `max_nodes`: at most
    that many of `nodes` blocks of experts per token (module docstring)."""
    if logits.dim() != 2:
        raise ValueError(f"route: logits must be (tokens, experts), got shape "
                         f"{tuple(logits.shape)}")
    if score not in SCORES:
        raise ValueError(f"route: score must be one of {SCORES}, got {score!r}")
    tokens, num_experts = logits.shape
    check_int("route", "top_k", top_k, high=num_experts, hint="experts per token")
    capacity = expert_capacity(tokens, num_experts, top_k=top_k, capacity_factor=capacity_factor)
    dtype = torch.promote_types(logits.dtype, torch.float32)
    logits = logits.to(dtype)
    probs = torch.softmax(logits, dim=-1) if score == "softmax" else torch.sigmoid(logits)
    choice = probs
    if bias is not None:
        if bias.shape != (num_experts,):
            raise ValueError(f"route: bias must have one entry per expert ({num_experts},), "
                             f"got shape {tuple(bias.shape)}")
        choice = probs.detach() + bias.detach().to(dtype)   # for the choice only
    if max_nodes is not None:
        allowed = node_limited_mask(choice.detach(), top_k=top_k, nodes=nodes,
                                    max_nodes=max_nodes)
        choice = choice.masked_fill(~allowed, float("-inf"))
    expert = choice.topk(top_k, dim=-1).indices
    top = probs.gather(1, expert)                           # gates from the scores themselves
    gate = top if top_k == 1 and score == "softmax" else top / top.sum(-1, keepdim=True)
    slot = slots(expert, num_experts)
    return Routing(probs=probs, expert=expert, gate=gate, slot=slot, kept=slot < capacity,
                   capacity=capacity, score=score)


def load_balancing_loss(routing: Routing) -> Tensor:
    """Switch's E · Σ_i f_i · P_i for this group (0 for a group without tokens). Sigmoid scores
    are first normalised over the experts, s_t,i / Σ_j s_t,j, as DeepSeek-V3 does for its
    sequence-wise balance loss (§2.1.2), so that P is a distribution as Switch's is."""
    if routing.tokens == 0:
        return routing.probs.sum()  # a zero that keeps the graph: every rank runs backward
    first = torch.bincount(routing.expert[:, 0], minlength=routing.num_experts)
    f = first.to(routing.probs.dtype) / routing.tokens
    probs = routing.probs
    if routing.score == "sigmoid":
        probs = probs / probs.sum(-1, keepdim=True)
    p = probs.mean(0)
    return routing.num_experts * (f * p).sum()


def router_z_loss(logits: Tensor) -> Tensor:
    """ST-MoE's z-loss, mean over tokens of (logsumexp of the router logits)², in float32 at
    least (0 for a group without tokens, keeping the graph)."""
    if logits.dim() != 2:
        raise ValueError(f"router_z_loss: logits must be (tokens, experts), got shape "
                         f"{tuple(logits.shape)}")
    wide = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if wide.shape[0] == 0:
        return wide.sum()
    return torch.logsumexp(wide, dim=-1).square().mean()
