"""A bank of experts: E feed-forward networks with their weights stacked, so that a rank can hold
any contiguous slice of them.

Expert e is the transformer's MLP (Vaswani et al., 2017, §3.3; Switch Transformers §2 replaces the
dense FFN by E of them):

    E_e(x) = GELU(x · W1[e] + b1[e]) · W2[e] + b2[e]      W1 (E, d, f), W2 (E, f, d)

Its parameters: E·(2·d·f + f + d); per token it runs only the k experts it was routed to, so the
FLOPs of a token are k·2·(2·d·f) forward, whatever E is (Switch §2: "sparsely activated").

Rows arrive grouped by expert (`toolkit.expert_parallel.dispatch`): `counts[i]` rows for the i-th
expert this bank holds, one after another. A bank made by `slice(first, n)` holds experts
[first, first + n) of the full bank, as parameters of their own (expert parallelism: rank r of
ep holds E/ep experts).

`SharedExperts` are DeepSeekMoE's *shared* experts (Dai et al., 2024, arXiv:2401.06066, §3.2;
DeepSeek-V3 §2.1.2): K_s MLPs of the same shape that every token runs, ungated, beside its k
routed ones: y_t = Σ_{i ≤ K_s} S_i(x_t) + Σ_j g_t,j·E_e_t,j(x_t). They hold what every token
needs, so the routed experts need not each learn it again. Under expert parallelism they are
replicated on every rank like the router (their gradients summed over the data-parallel ranks),
never sent anywhere.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..arguments import check_int

__all__ = ["Experts", "SharedExperts", "uniform_"]


@torch.no_grad()
def uniform_(param: Tensor, fan_in: int, generator: torch.Generator | None = None) -> Tensor:
    """Fill `param` uniformly in ±1/√fan_in (nn.Linear's default), drawn from `generator` on
    its device (a `torch.Generator()` lives on the CPU, so every rank and device gets the same
    numbers), then copied over; without a generator, from the default RNG of `param`'s device."""
    bound = 1 / math.sqrt(fan_in)
    source = generator.device if generator is not None else param.device
    values = torch.rand(param.shape, generator=generator, dtype=torch.float64, device=source)
    return param.copy_((2 * values - 1) * bound)


class Experts(nn.Module):
    """`num_experts` MLPs d → f → d with stacked weights; `first` is the global index of the
    first one (0 for a full bank)."""

    def __init__(self, num_experts: int, d_model: int, d_ff: int, *, first: int = 0,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        for name, v in (("num_experts", num_experts), ("d_model", d_model), ("d_ff", d_ff)):
            check_int("Experts", name, v)
        self.first = check_int("Experts", "first", first, low=0)
        e, d, f = num_experts, d_model, d_ff
        self.w1 = nn.Parameter(torch.empty(e, d, f, device=device, dtype=dtype))
        self.b1 = nn.Parameter(torch.empty(e, f, device=device, dtype=dtype))
        self.w2 = nn.Parameter(torch.empty(e, f, d, device=device, dtype=dtype))
        self.b2 = nn.Parameter(torch.empty(e, d, device=device, dtype=dtype))
        self.reset_parameters(generator)

    @property
    def num_experts(self) -> int:
        return self.w1.shape[0]

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """nn.Linear's default: uniform in ±1/√fan_in for weights and biases, drawn from
        `generator` (`uniform_`)."""
        for p, fan_in in ((self.w1, self.w1.shape[1]), (self.b1, self.w1.shape[1]),
                          (self.w2, self.w2.shape[1]), (self.b2, self.w2.shape[1])):
            uniform_(p, fan_in, generator)

    def slice(self, first: int, n: int) -> "Experts":
        """A bank of experts [first, first + n) of this one, with copies of their weights."""
        check_int("Experts.slice", "first", first, low=0)
        check_int("Experts.slice", "n", n)
        if first + n > self.num_experts:
            raise ValueError(f"Experts.slice: experts [{first}, {first + n}) are not all in "
                             f"this bank of {self.num_experts}")
        out = Experts(n, self.w1.shape[1], self.w1.shape[2], first=self.first + first,
                      device=self.w1.device, dtype=self.w1.dtype)
        with torch.no_grad():
            for mine, full in zip(out.parameters(), self.parameters()):
                mine.copy_(full[first:first + n])
        return out

    def forward(self, rows: Tensor, counts: list[int]) -> Tensor:
        """(N, d) rows grouped by expert, `counts[i]` of them for this bank's expert i → (N, d)."""
        if len(counts) != self.num_experts or sum(counts) != rows.shape[0]:
            raise ValueError(f"Experts: counts must give the rows of each of the "
                             f"{self.num_experts} experts and add up to {rows.shape[0]}, "
                             f"got {counts}")
        out, start = [], 0
        for i, n in enumerate(counts):
            if n:  # an expert with no rows runs nothing (and gets a zero gradient)
                h = F.gelu(rows[start:start + n] @ self.w1[i] + self.b1[i])  # (n, d)@(d, f)
                out.append(h @ self.w2[i] + self.b2[i])                       # (n, f)@(f, d)
            start += n
        return torch.cat(out) if out else rows * 0  # rows * 0: empty, but in the graph

    def extra_repr(self) -> str:
        return (f"experts {self.first}..{self.first + self.num_experts - 1}, "
                f"d_model={self.w1.shape[1]}, d_ff={self.w1.shape[2]}")


class SharedExperts(nn.Module):
    """`num_shared` MLPs d → f → d that every token runs, ungated, their outputs summed (module
    docstring): a replicated module, deliberately not an `Experts` bank, so that
    `expert_parameters` leaves it with the dense parameters."""

    def __init__(self, num_shared: int, d_model: int, d_ff: int, *,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        for name, v in (("num_shared", num_shared), ("d_model", d_model), ("d_ff", d_ff)):
            check_int("SharedExperts", name, v)
        s, d, f = num_shared, d_model, d_ff
        self.w1 = nn.Parameter(torch.empty(s, d, f, device=device, dtype=dtype))
        self.b1 = nn.Parameter(torch.empty(s, f, device=device, dtype=dtype))
        self.w2 = nn.Parameter(torch.empty(s, f, d, device=device, dtype=dtype))
        self.b2 = nn.Parameter(torch.empty(s, d, device=device, dtype=dtype))
        for p, fan_in in ((self.w1, d), (self.b1, d), (self.w2, f), (self.b2, f)):
            uniform_(p, fan_in, generator)

    @property
    def num_shared(self) -> int:
        return self.w1.shape[0]

    def forward(self, x: Tensor) -> Tensor:
        """(T, d) → (T, d): Σ_i S_i(x)."""
        out = x.new_zeros(x.shape)
        for i in range(self.num_shared):
            h = F.gelu(x @ self.w1[i] + self.b1[i])      # (T, d) @ (d, f)
            out = out + h @ self.w2[i] + self.b2[i]      # (T, f) @ (f, d)
        return out

    def extra_repr(self) -> str:
        return (f"{self.num_shared} shared, d_model={self.w1.shape[1]}, "
                f"d_ff={self.w1.shape[2]}")
