"""Auxiliary-loss-free load balancing: a bias per expert, moved against its load after each step.

Wang et al., 2024, "Auxiliary-Loss-Free Load Balancing Strategy for Mixture-of-Experts"
(arXiv:2408.15664), Algorithm 1; DeepSeek-V3 (DeepSeek-AI, 2024, arXiv:2412.19437), §2.1.2:

    choose     top-k of s_t,e + b_e           the bias steers the choice; the gates stay s_t,e
    then, with c_e the choices of expert e over the whole batch and c̄ = mean_e c_e:
    update     b_e ← b_e + γ · sign(c̄ − c_e)  overloaded experts lose γ, underloaded ones gain it

γ is the bias update speed (DeepSeek-V3 §4.2: 0.001 for the first 14.3T tokens, then 0). No
gradient is involved: nothing competes with the language-model loss, where Switch's auxiliary
loss (`router.load_balancing_loss`) trades balance against quality through its weight α
(Wang et al., §1). DeepSeek-V3 keeps a tiny sequence-wise auxiliary loss beside it (α = 10⁻⁴).

**On ranks.** Each rank routes its own tokens and counts its own load; the bias must follow the
load of the whole batch, so the counts are summed over every rank that routes with a copy of
the router (all data-parallel ranks: ep and edp together) before the update: one all-reduce of
E int64 counts per MoE layer and step (`balance_step`, 8·E bytes passed in). Every rank then
applies the same update to the same bias, so the copies never drift apart. Updating from the
rank's own counts instead gives each rank a different bias: a router that routes the same token
differently on different ranks.

Balance is measured as Wang et al. do ("MaxVio", the maximal violation): (max_e c_e − c̄) / c̄,
0 when every expert gets the mean (`max_violation`).

Shapes: bias, load (E,). `simulate` is the single-process reference: the batch's logits of each
step routed together.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from ..arguments import is_number
from .router import route

__all__ = ["balance_step", "max_violation", "simulate", "update_bias"]


def _rate(owner: str, rate: float) -> float:
    if not is_number(rate) or rate < 0:
        raise ValueError(f"{owner}: rate must be a number >= 0 (the bias update speed γ), got "
                         f"{rate!r}")
    return float(rate)


def update_bias(bias: Tensor, load: Tensor, *, rate: float) -> Tensor:
    """b + γ·sign(c̄ − c): `load` (E,) the batch's choices per expert (summed over every rank)."""
    rate = _rate("update_bias", rate)
    if bias.shape != load.shape or bias.dim() != 1:
        raise ValueError(f"update_bias: bias and load must both be (experts,), got shapes "
                         f"{tuple(bias.shape)} and {tuple(load.shape)}")
    counts = load.to(torch.float64)
    return bias + rate * torch.sign(counts.mean() - counts).to(bias.dtype)


def max_violation(load: Sequence[float] | Tensor) -> float:
    """(max_e c_e − c̄) / c̄, Wang et al.'s MaxVio; 0 for a load of zeros."""
    # A statistic read on the host: the counts' own device if a tensor, else the CPU's.
    device = load.device if isinstance(load, Tensor) else "cpu"
    counts = torch.as_tensor(load, dtype=torch.float64, device=device)
    mean = counts.mean().item()
    return (counts.max().item() - mean) / mean if mean > 0 else 0.0


def balance_step(bias: Tensor, load: Tensor, *, rate: float,
                 group: Any = None) -> tuple[Tensor, Tensor]:
    """On a rank: sum this rank's `load` (E,) over `group` (None: every rank) with one
    all-reduce of int64 counts, then `update_bias`. Returns (new bias, the batch's load)."""
    total = load.detach().to(torch.int64).clone()
    dist.all_reduce(total, group=group)
    return update_bias(bias, total, rate=rate), total


def simulate(logits: Sequence[Tensor], *, top_k: int, rate: float, score: str = "sigmoid",
             bias: Tensor | None = None) -> tuple[list[Tensor], list[Tensor]]:
    """Route the batch of each step (`logits[i]`: (T, E), every rank's tokens together) with
    the current bias and update it (no capacity limit). Returns (load per step, bias after each
    step): what `balance_step` on ranks must reproduce."""
    if not logits:
        raise ValueError("simulate: logits must hold at least one step")
    num_experts = logits[0].shape[1]
    b = (torch.zeros(num_experts, dtype=torch.float64, device=logits[0].device) if bias is None
         else bias.clone())
    loads, biases = [], []
    for step_logits in logits:
        load = route(step_logits, top_k=top_k, capacity_factor=None, score=score,
                     bias=b).load()
        b = update_bias(b, load, rate=rate)
        loads.append(load)
        biases.append(b)
    return loads, biases
