"""Auxiliary-loss-free balancing on real ranks, beside the single-process simulation and the byte
formula (the algorithm: `toolkit.expert_parallel.balance`).

    run = balance_on_ranks(4, steps=40, tokens=64, num_experts=8, top_k=2, rate=0.01)
    run.loads        # (steps, E): the batch's load each step, as every rank saw it
    run.reference    # the same from `balance.simulate` on one process, the batch routed whole
    run.unbalanced   # the same router without the bias (rate 0)
    run.calls        # per rank: (op, bytes) of every recorded call: one all-reduce of 8·E a step

Every rank draws its own tokens' router logits each step (`skewed_logits`: Gaussian noise plus a
fixed tilt towards the low-numbered experts, a router that has learnt to favour a few), routes
them with its copy of the bias (sigmoid scores, no capacity limit, as DeepSeek-V3), sums the
load over all ranks (`balance_step`) and moves the bias. The parent rebuilds every rank's logits
from the same seeds and routes each step's batch in one piece.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import comm
from ..arguments import check_int
from ..expert_parallel import balance_step, max_violation, route, simulate
from ..launch import device, spawn

__all__ = ["BalanceRun", "balance_on_ranks", "skewed_logits"]


def skewed_logits(step: int, rank: int, *, tokens: int, num_experts: int, skew: float,
                  seed: int = 0) -> torch.Tensor:
    """(tokens, E) float64 router logits of `rank`'s tokens at `step`: N(0, 1) noise plus
    skew·(1 … −1) across the experts; drawn on the CPU from a generator seeded by (seed, step,
    rank), so a rank and the parent draw the same numbers."""
    gen = torch.Generator().manual_seed(((seed * 100_003) + step) * 1_009 + rank)
    noise = torch.randn(tokens, num_experts, generator=gen, dtype=torch.float64,
                        device=gen.device)
    return noise + skew * torch.linspace(1.0, -1.0, num_experts, dtype=torch.float64,
                                         device=gen.device)


@dataclass
class BalanceRun:
    """What `balance_on_ranks` found."""

    loads: torch.Tensor
    """(steps, E) int64: the batch's load each step (after the all-reduce, rank 0's copy)."""
    bias: torch.Tensor
    """(E,): the bias after the last step (rank 0's)."""
    ranks_agree: bool
    """Whether every rank ended with the same loads and bias, bit for bit."""
    reference: torch.Tensor
    """(steps, E): the loads of `simulate`, the whole batch on one process."""
    reference_bias: torch.Tensor
    """(E,): `simulate`'s final bias."""
    unbalanced: torch.Tensor
    """(steps, E): the loads without the bias (rate 0), same tokens."""
    calls: dict[int, list[tuple[str, int]]]
    """Per rank: (op, bytes passed in) of every recorded call."""

    def violation(self, which: str = "loads") -> list[float]:
        """MaxVio per step of `loads`, `reference` or `unbalanced`."""
        return [max_violation(row) for row in getattr(self, which)]


def _rank(rank: int, world_size: int, cfg: dict) -> dict:
    dev = device()
    bias = torch.zeros(cfg["num_experts"], dtype=torch.float64, device=dev)
    loads = []
    with comm.recording() as trace:
        for step in range(cfg["steps"]):
            logits = skewed_logits(step, rank, tokens=cfg["tokens"],
                                   num_experts=cfg["num_experts"], skew=cfg["skew"],
                                   seed=cfg["seed"]).to(dev)
            load = route(logits, top_k=cfg["top_k"], capacity_factor=None, score="sigmoid",
                         bias=bias).load()
            bias, total = balance_step(bias, load, rate=cfg["rate"])
            loads.append(total.cpu())
    return dict(loads=torch.stack(loads), bias=bias.cpu(),
                calls=[(e.op, e.nbytes) for e in trace])


def balance_on_ranks(world_size: int, *, steps: int, tokens: int, num_experts: int,
                     top_k: int, rate: float, skew: float = 1.0, seed: int = 0,
                     timeout: float = 60) -> BalanceRun:
    """Run the bias update for `steps` steps on `world_size` ranks, `tokens` tokens per rank and
    step (module docstring), and set it beside the one-process simulation."""
    for name, v in (("steps", steps), ("tokens", tokens), ("num_experts", num_experts)):
        check_int("balance_on_ranks", name, v)
    check_int("balance_on_ranks", "top_k", top_k, high=num_experts)
    cfg = dict(steps=steps, tokens=tokens, num_experts=num_experts, top_k=top_k, rate=rate,
               skew=skew, seed=seed)
    results = spawn(_rank, world_size, cfg, echo=False, timeout=timeout)
    batches = [torch.cat([skewed_logits(step, r, tokens=tokens, num_experts=num_experts,
                                        skew=skew, seed=seed) for r in range(world_size)])
               for step in range(steps)]
    ref_loads, ref_biases = simulate(batches, top_k=top_k, rate=rate)
    plain, _ = simulate(batches, top_k=top_k, rate=0.0)
    first = results[0]
    agree = all(torch.equal(r["loads"], first["loads"]) and torch.equal(r["bias"], first["bias"])
                for r in results)
    return BalanceRun(loads=first["loads"], bias=first["bias"], ranks_agree=agree,
                      reference=torch.stack(ref_loads), reference_bias=ref_biases[-1],
                      unbalanced=torch.stack(plain),
                      calls={rank: r["calls"] for rank, r in enumerate(results)})
