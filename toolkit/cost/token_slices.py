"""TeraPipe's cost of cutting one sequence into token slices, and its search for the best cut.

Li et al., "TeraPipe: Token-Level Pipeline Parallelism for Training Large-Scale Language
Models", ICML 2021, section 3.3. With p stages and a sequence cut into slices of l_1 … l_n
tokens, slice i taking t_i through one stage (forward plus backward), a step takes

    T = Σ_i t_i + (p − 1) · max_j t_j

(`toolkit.cost.bubble.terapipe_time`): the sum is the work, the second term the pipeline's fill
and drain, set by the slowest slice. A causal layer's slice does not cost the same wherever it
sits: its l queries attend to every earlier token, so

    t(l, c) = s₀ + a · l + b · (l · c + l (l + 1) / 2)        (c tokens before the slice)

with s₀ a fixed cost per slice (launching its kernels and messages; what keeps slices from
being one token long: TeraPipe measures it as the device's throughput falling for small
slices, section 3.3), a the time per token of the position-wise work (projections, MLP:
24·h² multiply-adds per token and layer, Narayanan et al. SC 2021, section 3) and b the time
per query-key pair (4·h per pair: scores and the weighted sum). Equal slices make the last
slice the slowest, so the best cut makes later slices shorter. The search enumerates the
slowest slice's time t_max and, for each, cuts the sequence into slices no slower than t_max
with the least total time (dynamic programming over prefixes), then keeps the t_max with the
least T: TeraPipe's algorithm, here over token counts in steps of `step`.

    slice_times([8, 8], per_token=1.0, per_pair=0.1)    # [8 + 0.1·36, 8 + 0.1·(8·8 + 36)]
    best_slicing(64, p=4, per_token=1, per_pair=0.05, per_slice=8, step=4)
    # [20, 12, 8, 8, 8, 8]: later slices attend further, so they are cut shorter
"""

from __future__ import annotations

from typing import Sequence

from ..arguments import check_int
from .bubble import terapipe_time


def _check_rates(owner: str, per_token: float, per_pair: float, per_slice: float = 0.0) -> None:
    for name, x in (("per_token", per_token), ("per_pair", per_pair), ("per_slice", per_slice)):
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not x >= 0:
            raise ValueError(f"{owner}: {name} (seconds per {name[4:]}) must be a number >= 0, "
                             f"got {x!r}")


def slice_time(length: int, before: int, *, per_token: float, per_pair: float,
               per_slice: float = 0.0) -> float:
    """t(l, c): one slice of `length` tokens after `before` tokens, through one stage."""
    pairs = length * before + length * (length + 1) / 2     # causal: query j sees c + j + 1
    return per_slice + per_token * length + per_pair * pairs


def slice_times(lengths: Sequence[int], *, per_token: float, per_pair: float,
                per_slice: float = 0.0) -> list[float]:
    """t_i of every slice of a cut given by its `lengths` (in order)."""
    _check_rates("slice_times", per_token, per_pair, per_slice)
    out, before = [], 0
    for i, n in enumerate(lengths):
        check_int("slice_times", f"lengths[{i}]", n, hint="tokens in a slice")
        out.append(slice_time(n, before, per_token=per_token, per_pair=per_pair,
                              per_slice=per_slice))
        before += n
    return out


def best_slicing(tokens: int, *, p: int, per_token: float, per_pair: float,
                 per_slice: float = 0.0, step: int = 1) -> list[int]:
    """The slice lengths (multiples of `step`, the last one taking any remainder) that minimise
    `terapipe_time` for a sequence of `tokens` on p stages (TeraPipe, section 3.3)."""
    check_int("best_slicing", "tokens", tokens, hint="sequence length")
    check_int("best_slicing", "p", p, hint="stages")
    check_int("best_slicing", "step", step, hint="tokens per unit of a slice")
    _check_rates("best_slicing", per_token, per_pair, per_slice)
    # Cut points on a grid of `step` tokens (and the end): slices between two grid points.
    points = list(range(0, tokens, step)) + [tokens]
    n = len(points) - 1

    def t(i: int, j: int) -> float:                 # slice from point i to point j
        return slice_time(points[j] - points[i], points[i], per_token=per_token,
                          per_pair=per_pair, per_slice=per_slice)

    best: tuple[float, list[int]] = (float("inf"), [tokens])
    for t_max in sorted({t(i, j) for i in range(n) for j in range(i + 1, n + 1)}):
        if (p - 1) * t_max >= best[0]:
            break                                   # the drain alone costs more already
        least = [0.0] + [float("inf")] * n          # least total time of a cut of the prefix
        last = [0] * (n + 1)
        for j in range(1, n + 1):
            for i in range(j):
                cost = t(i, j)
                if cost <= t_max and least[i] + cost < least[j]:
                    least[j], last[j] = least[i] + cost, i
        if least[n] == float("inf"):
            continue
        cuts, j = [], n
        while j:
            cuts.append(points[j] - points[last[j]])
            j = last[j]
        lengths = cuts[::-1]
        times = slice_times(lengths, per_token=per_token, per_pair=per_pair, per_slice=per_slice)
        total = terapipe_time(times, p=p)
        if total < best[0] - 1e-12:
            best = (total, lengths)
    return best[1]


__all__ = ["best_slicing", "slice_time", "slice_times"]
