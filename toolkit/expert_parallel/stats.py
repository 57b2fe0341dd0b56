"""The router's statistics: tokens per expert, what the capacity dropped, how uneven the load is,
and the padding a fixed-size buffer computes for nothing.

For one group (one rank's tokens) with T tokens, k choices each, E experts and capacity C
(`toolkit.cost.experts` holds the formulas):

    load_e        choices of expert e before the capacity cut          Σ_e load_e = k·T
    kept_e        min(load_e, C)
    dropped       Σ_e max(0, load_e − C)  choices; dropped_tokens: tokens with no choice kept
    imbalance     max_e load_e / (k·T/E)   1 when balanced (Switch §2.2 calls the remedy the
                                          load-balancing loss; the symptom is this ratio)
    padding       E·C − Σ_e kept_e        rows a padded buffer sends and computes for nothing

`merge` adds the groups of several ranks: loads, kept, dropped and padding add up, imbalance is
taken of the summed loads (as the experts see it over the whole batch).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..cost.experts import imbalance as load_imbalance
from .router import Routing

__all__ = ["RouterStats", "merge", "router_stats"]


@dataclass(frozen=True)
class RouterStats:
    """Routing statistics of one or more groups (plain Python numbers)."""

    tokens: int
    """T: tokens routed."""
    top_k: int
    """k: choices per token."""
    capacity: tuple[int, ...]
    """C of each group."""
    load: tuple[int, ...]
    """Choices per expert before the capacity cut."""
    kept: tuple[int, ...]
    """Choices per expert that got a slot."""
    dropped_tokens: int
    """Tokens none of whose choices got a slot (the layer outputs zero for them)."""

    @property
    def choices(self) -> int:
        """k·T."""
        return self.tokens * self.top_k

    @property
    def dropped(self) -> int:
        """Choices dropped: Σ_e (load_e − kept_e)."""
        return sum(self.load) - sum(self.kept)

    @property
    def dropped_fraction(self) -> float:
        """dropped / (k·T) (0 without tokens)."""
        return self.dropped / self.choices if self.choices else 0.0

    @property
    def imbalance(self) -> float:
        """max_e load_e / mean_e load_e."""
        return load_imbalance(self.load)

    @property
    def slots(self) -> int:
        """E·C summed over groups: rows of a padded buffer."""
        return len(self.load) * sum(self.capacity)

    @property
    def padding(self) -> int:
        """Slots that hold no token: E·ΣC − Σ kept."""
        return self.slots - sum(self.kept)

    def as_dict(self) -> dict:
        """A flat row for a table."""
        return dict(tokens=self.tokens, top_k=self.top_k, capacity=sum(self.capacity),
                    max_load=max(self.load), dropped=self.dropped,
                    dropped_fraction=self.dropped_fraction, dropped_tokens=self.dropped_tokens,
                    imbalance=self.imbalance, slots=self.slots, padding=self.padding)


def router_stats(routing: Routing) -> RouterStats:
    """The statistics of one group's routing (host numbers; one device sync)."""
    return RouterStats(tokens=routing.tokens, top_k=routing.top_k,
                       capacity=(routing.capacity,), load=tuple(routing.load().tolist()),
                       kept=tuple(routing.kept_load().tolist()),
                       dropped_tokens=int((~routing.kept.any(dim=1)).sum()))


def merge(stats: list[RouterStats]) -> RouterStats:
    """The statistics of several groups together (e.g. every rank of an ep group)."""
    if not stats:
        raise ValueError("merge: need at least one RouterStats")
    first = stats[0]
    if any(s.top_k != first.top_k or len(s.load) != len(first.load) for s in stats):
        raise ValueError("merge: every group must have the same experts and top_k")
    return RouterStats(tokens=sum(s.tokens for s in stats), top_k=first.top_k,
                       capacity=tuple(c for s in stats for c in s.capacity),
                       load=tuple(map(sum, zip(*(s.load for s in stats)))),
                       kept=tuple(map(sum, zip(*(s.kept for s in stats)))),
                       dropped_tokens=sum(s.dropped_tokens for s in stats))
