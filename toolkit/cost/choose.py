"""Which algorithm the α-β model picks: the fastest at one size, and the sizes where the winner
changes; plus the byte formatting every table and figure shares (`toolkit.formats.human_bytes`,
re-exported: IEC units, KiB and MiB).

Pure functions of `toolkit.cost.models` (numbers in, numbers out). `toolkit.viz.cost` draws
them; lesson 03's explorer reports them.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence


from ..arguments import check_int
from ..formats import human_bytes  # the course's byte units (IEC: KiB, MiB), re-exported here
from .models import COEFFICIENTS, AlphaBeta, crossover_bytes, predict

__all__ = ["check_algorithms", "check_p_link", "fastest", "human_bytes", "switch_points"]


def _fastest(times: Mapping[str, float]) -> str:
    """The fastest algorithm's name; algorithms tied with it (same model) joined by ' = '."""
    best = min(times.values())
    return " = ".join(a for a, t in times.items() if t <= best * (1 + 1e-9))


def fastest(p: int, link: AlphaBeta, nbytes: float, algorithms: Sequence[str] | None = None, *,
            collective: str = "all_reduce") -> tuple[str, dict[str, float]]:
    """(name of the fastest algorithm in the model, predicted seconds of each) at n = `nbytes`.

    Algorithms the model cannot tell apart (ring and sharded PS share a(p), b(p)) are named
    together, ``"ring = sharded_ps"``.
    """
    algorithms = check_algorithms(collective, algorithms, "fastest")
    times = {a: float(predict(collective, a, nbytes, p, link)) for a in algorithms}
    return _fastest(times), times


def check_algorithms(collective: str, algorithms: Sequence[str] | None, name: str) -> list[str]:
    if collective not in COEFFICIENTS:
        raise ValueError(f"{name}: no cost model for collective {collective!r}; "
                         f"choose from {', '.join(COEFFICIENTS)}")
    known = list(COEFFICIENTS[collective])
    algorithms = known if algorithms is None else list(algorithms)
    if not algorithms:
        raise ValueError(f"{name}: no algorithms to draw")
    for a in algorithms:
        if a not in known:
            raise ValueError(f"{name}: {collective} has no model for algorithm {a!r}; "
                             f"choose from {', '.join(known)}")
    return algorithms


def check_p_link(p: Any, link: Any, name: str) -> None:
    check_int(name, "p", p, low=2, hint="the world size")
    if not isinstance(link, AlphaBeta):
        raise TypeError(f"{name}(link=...) must be a toolkit.cost.AlphaBeta, got "
                        f"{type(link).__name__}")
    if not (link.alpha >= 0 and link.beta >= 0):
        raise ValueError(f"{name}: α and β must be >= 0, got {link}")


def switch_points(p: int, link: AlphaBeta, nbytes_range: tuple[float, float],
                  algorithms: Sequence[str] | None = None, *,
                  collective: str = "all_reduce") -> list[tuple[float, str, str]]:
    """Sizes in `nbytes_range` where the model's fastest algorithm changes, in increasing order:
    (n*, fastest below, fastest above). n* is a pairwise `toolkit.crossover_bytes` that lies
    on the lower envelope of all the algorithms' times."""
    algorithms = check_algorithms(collective, algorithms, "switch_points")
    lo, hi = nbytes_range
    candidates = sorted({crossover_bytes(collective, a, b, p, link)
                         for a in algorithms for b in algorithms if a != b})
    out = []
    for n in candidates:
        if not lo < n < hi:
            continue
        below = _fastest({a: float(predict(collective, a, n * (1 - 1e-6), p, link))
                          for a in algorithms})
        above = _fastest({a: float(predict(collective, a, n * (1 + 1e-6), p, link))
                          for a in algorithms})
        if below != above:
            out.append((float(n), below, above))
    return out
