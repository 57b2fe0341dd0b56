"""Lab 07's constructed routings: every value drawn from the grade's secret, laid out so that two
mistakes always show, whatever the secret.

A random router hides them in some grades: an unswapped backward all-to-all is right when every
rank happens to receive as many rows from each peer as it sends to it, and a wrong drop order
is right when the overflowing experts' drops happen not to depend on the order.

**Drop order** (`order`, for the "keep" call). GShard's queue (Lepikhin et al., 2020,
Algorithm 1) takes every token's first choice, tokens in order, then every second choice, …; a
choice is kept when fewer than C earlier ones in that order went to its expert. Here a hot
expert h gets C + 1 first choices (tokens B_1 < … < B_{C+1}), one later choice (j ≥ 1) from a
token A before them all and one from a token Z after them all; h appears nowhere else. Kept on
h, with C ≥ 3:

    GShard (j, then t)                 B_1 … B_C
    tokens backwards (j, then −t)      B_2 … B_{C+1}
    token by token (t, then j)         A, B_1 … B_{C−1}
    token by token from the end        Z, B_{C+1} … B_3
    later choices first (−j, then t)   A, Z, B_1 … B_{C−2}
    the queue backwards (−j, −t)       Z, A, B_{C+1} … B_4
    C + 1 slots (GShard, off by one)   B_1 … B_{C+1}

every set different from the others (tests/test_lab07_cases.py checks them over 200 seeds); a
choice cannot be ranked by its gate or by rank here, `keep` sees one rank's `expert` only.
With top-1 there are no later choices: C + 1 first choices, GShard keeps B_1 … B_C, backwards
B_2 … B_{C+1}.

**Uneven splits** (`uneven`, for the "moe" call). Rank r sends a_r kept rows to every other rank
(1 ≤ a_r ≤ (E/p)·C_r, spread over that rank's experts so none overflows; its other choices go
to its own experts, where drops do not change what travels): with all a_r different the pieces
r → j and j → r differ for every pair, and with p·a_r ≠ Σ a every rank receives
Σ_{j≠r} a_j ≠ (p − 1)·a_r rows other than it sends (so some send more than they receive and
some fewer). The router W (E, d) = 2·Q with Q's rows orthonormal (E ≤ d), and x_t = Qᵀz_t/2
plus noise orthogonal to Q's rows, so W·x_t = z_t exactly: logits z_t with the planned k experts
on top (margins ≥ 0.6), the other logits and the noise from the secret.

Shapes: expert (T, k) int64; router (E, d); x (T, d); all float64, on the CPU generator.
"""

from __future__ import annotations

import itertools

import torch

from toolkit.cost.experts import expert_capacity

ROUTER_NORM = 2.0
"""Norm of each router row; x = Qᵀz / 2 keeps x's entries about as large as the logits."""


def _int(n: int, gen: torch.Generator) -> int:
    return int(torch.randint(n, (1,), generator=gen))


def _uniform(gen: torch.Generator, shape, low: float, high: float) -> torch.Tensor:
    return low + (high - low) * torch.rand(tuple(shape), generator=gen, dtype=torch.float64)


def order(case: dict, gen: torch.Generator) -> torch.Tensor:
    """(T, k) experts whose drops at one hot expert depend on the queue's order (module
    docstring)."""
    tokens, experts, k, capacity = case["tokens"], case["experts"], case["top_k"], case["capacity"]
    special = capacity + 3 if k > 1 else capacity + 1  # A, B_1 … B_{C+1}, Z
    if capacity < 3 or tokens < special or experts < k + 1:
        raise ValueError(f"layout 'order' needs capacity >= 3, tokens >= {special} and experts "
                         f">= top_k + 1, got {case}: enlarge the case")
    hot = _int(experts, gen)
    others = torch.tensor([e for e in range(experts) if e != hot])
    expert = torch.stack([others[torch.randperm(experts - 1, generator=gen)[:k]]
                          for _ in range(tokens)])
    chosen = torch.randperm(tokens, generator=gen)[:special].sort().values.tolist()
    if k > 1:
        a, *firsts, z = chosen
        expert[a, 1 + _int(k - 1, gen)] = hot
        expert[z, 1 + _int(k - 1, gen)] = hot
    else:
        firsts = chosen
    expert[firsts, 0] = hot
    return expert


def plan(case: dict, world_size: int, gen: torch.Generator) -> list[int]:
    """a_r: kept rows rank r sends to each other rank (module docstring), drawn from every plan
    that fits the case."""
    p, experts, k = world_size, case["experts"], case["top_k"]
    local = experts // p
    caps = [expert_capacity(t, experts, top_k=k, capacity_factor=case["capacity_factor"])
            for t in case["tokens"]]
    highest = [min(local * c, t * k // (p - 1)) for c, t in zip(caps, case["tokens"])]
    plans = [a for a in itertools.product(*(range(1, h + 1) for h in highest))
             if len(set(a)) == p and all(p * v != sum(a) for v in a)]
    if p < 2 or k > local or not plans:
        raise ValueError(f"layout 'uneven' needs 2+ ranks, top_k <= experts per rank and room "
                         f"for different a_r per rank (at most {highest}), got {case}")
    return list(plans[_int(len(plans), gen)])


def routes(rank: int, away: int, *, tokens: int, world_size: int, local: int, k: int,
           gen: torch.Generator) -> torch.Tensor:
    """(T, k) experts of one rank: `away` choices for each other rank, cycling over its
    experts from a random one, packed k to a token (k ≤ local keeps a token's experts
    distinct); the rest on this rank's own experts; tokens and choice ranks shuffled."""
    pieces = []
    for j in (j for j in range(world_size) if j != rank):
        start = _int(local, gen)
        pieces += [j * local + (start + i) % local for i in range(away)]
    expert = torch.empty(tokens, k, dtype=torch.int64)
    for n, t in enumerate(torch.randperm(tokens, generator=gen).tolist()):
        row = pieces[n * k:(n + 1) * k]
        home = (rank * local + torch.randperm(local, generator=gen)).tolist()
        row += home[:k - len(row)]
        expert[t] = torch.tensor(row)[torch.randperm(k, generator=gen)]
    return expert


def logits(expert: torch.Tensor, experts: int, gen: torch.Generator) -> torch.Tensor:
    """(T, E) logits whose top-k, best first, are `expert`'s rows: choice i at 1.5 + k − i
    (± 0.2), the others in [−0.5, 0.5]."""
    n, k = expert.shape
    z = _uniform(gen, (n, experts), -0.5, 0.5)
    top = 1.5 + torch.arange(k, 0, -1, dtype=torch.float64) + _uniform(gen, (n, k), -.2, .2)
    return z.scatter(1, expert, top)


def uneven(case: dict, world_size: int, shared: torch.Generator, own: list[torch.Generator]
           ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """The router (E, d), each rank's x (T_r, d) and, for the tests, the experts (T_r, k) the
    router gives them: a planned routing (module docstring)."""
    d, experts, k = case["d"], case["experts"], case["top_k"]
    if experts > d:
        raise ValueError(f"layout 'uneven' needs experts <= d (the router solved exactly), got "
                         f"{experts} experts and d = {d}")
    away = plan(case, world_size, shared)
    q = torch.linalg.qr(torch.randn(d, d, generator=shared, dtype=torch.float64))[0][:experts]
    xs, planned = [], []
    for rank, (t, gen) in enumerate(zip(case["tokens"], own)):
        expert = routes(rank, away[rank], tokens=t, world_size=world_size,
                        local=experts // world_size, k=k, gen=gen)
        z = logits(expert, experts, gen)
        noise = _uniform(gen, (t, d), -1.0, 1.0)
        xs.append(z @ q / ROUTER_NORM + noise - noise @ q.T @ q)  # W·x = z exactly
        planned.append(expert)
    return ROUTER_NORM * q, xs, planned


__all__ = ["ROUTER_NORM", "logits", "order", "plan", "routes", "uneven"]
