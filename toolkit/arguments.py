"""Argument checks shared by every layer: an error that names the function, the argument, what
was expected and what arrived, written once.

    check_int("assign_layers", "p", p)                # ValueError: assign_layers: p must be an
                                                      # int >= 1, got 0
    check_ints("Layout", dp=dp, tp=tp)                # the same for several at once
    check_int("delay_blocks", "n", n, hint="number of blocks")
    check_int("pipeline_explorer", "m", m, high=16)   # ... must be an int in 1 … 16, got 20
    check_positive("Cluster", "peak_flops", peak)     # ... must be a number > 0, got 0

An int here is an integral number that is not a bool: Python counts True as 1, and a flag passed
where a count belongs is a mistake worth an error, not a one. Numbers (`check_positive`) are ints
or floats, bools again excluded. This module imports nothing from the toolkit, so any layer may
use it, and the grader's sandbox lets ranks read it (`toolkit.models` imports it). The launcher
keeps its own few checks: they raise TypeError for a wrong type, which its callers rely on.
"""

from __future__ import annotations

import numbers
from typing import Any


def is_int(value: Any) -> bool:
    """An integral number (int, numpy integer) that is not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A real number (int, float, numpy scalar) that is not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _prefix(owner: str, name: str, hint: str) -> str:
    where = f"{owner}: {name}" if owner else name
    return f"{where} ({hint})" if hint else where


def check_int(owner: str, name: str, value: Any, *, low: int = 1, high: int | None = None,
              hint: str = "", expected: str = "") -> int:
    """`value` if it is an int in [low, high] (no upper bound when `high` is None); else a
    ValueError ``"{owner}: {name} ({hint}) must be {expected}, got {value!r}"``, `expected`
    defaulting to ``"an int >= {low}"`` (``"an int in {low} … {high}"`` with a bound)."""
    if is_int(value) and value >= low and (high is None or value <= high):
        return value
    if not expected:
        expected = f"an int >= {low}" if high is None else f"an int in {low} … {high}"
    raise ValueError(f"{_prefix(owner, name, hint)} must be {expected}, got {value!r}")


def check_ints(owner: str, *, low: int = 1, expected: str = "", **values: Any) -> None:
    """`check_int` for every keyword argument, in order: ``check_ints("Layout", dp=0)``."""
    for name, value in values.items():
        check_int(owner, name, value, low=low, expected=expected)


def check_positive(owner: str, name: str, value: Any, *, hint: str = "") -> float:
    """`value` if it is a number > 0; else a ValueError
    ``"{owner}: {name} ({hint}) must be a number > 0, got {value!r}"``."""
    if is_number(value) and value > 0:
        return value
    raise ValueError(f"{_prefix(owner, name, hint)} must be a number > 0, got {value!r}")


def check_positives(owner: str, **values: Any) -> None:
    """`check_positive` for every keyword argument, in order."""
    for name, value in values.items():
        check_positive(owner, name, value)


__all__ = ["check_int", "check_ints", "check_positive", "check_positives", "is_int", "is_number"]
