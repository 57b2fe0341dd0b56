"""Checkpointing measured on real ranks: every case of `toolkit.recompute` (segments of k blocks,
selective, flash-style) run one step at a time on CPU ranks at once, beside Chen's model
(`toolkit.memory.checkpointing`) and the FLOP count (`toolkit.flops`).

Bytes are deterministic and asserted equal on every rank; times are medians over ranks and
repeats, with their spread, for a lesson to show and never to assert (a shared 2-core machine
times the scheduler as much as the recomputation).
"""

from __future__ import annotations

import statistics
from typing import Any, Callable, Collection, Sequence

import pandas as pd
from torch import Tensor

from ..flops import count_flops
from ..launch import spawn
from ..models import TinyGPT, TinyMLP
from ..recompute import checkpointed, measure

__all__ = ["sweep"]


def _case_name(case: dict[str, Any]) -> str:
    if case.get("selective"):
        return "selective"
    if case.get("attention", "materialised") != "materialised":
        return case["attention"]
    return "none" if case.get("every") is None else f"every {case['every']}"


def _wanted(flops: bool | Collection[str], name: str) -> bool:
    return flops if isinstance(flops, bool) else name in flops


def _step(model: Any, ck: Any, inputs: Tensor, targets: Tensor) -> Callable[[], None]:
    def step() -> None:
        model.zero_grad(set_to_none=True)
        ck(inputs, targets)[1].backward()
    return step


def _rank_sweep(rank: int, world_size: int, model: TinyGPT | TinyMLP, inputs: Tensor,
                targets: Tensor, cases: list[dict[str, Any]], repeats: int,
                flops: bool | Collection[str] = True) -> list[dict]:
    rows, plain = [], None
    for case in cases:
        m = measure(model, inputs, targets, repeats=repeats, **case)
        if plain is None:
            plain = m.grads
        rows.append(dict(case=_case_name(case), every=case.get("every"), rank=rank,
                         saved=m.saved_bytes, segment=m.segment_bytes, peak=m.peak_bytes,
                         forward_s=m.forward_s, backward_s=m.backward_s,
                         # Deterministic: counted once, on rank 0 (FlopCounterMode is slow).
                         flops=None if rank or not _wanted(flops, _case_name(case)) else
                         count_flops(_step(model, checkpointed(model, **case), inputs, targets)),
                         grad_diff=max((m.grads[k] - plain[k]).abs().max().item()
                                       for k in plain)))
    model.zero_grad(set_to_none=True)
    return rows


def sweep(model: TinyGPT | TinyMLP, inputs: Tensor, targets: Tensor,
          cases: Sequence[dict[str, Any]], *, world_size: int = 2, repeats: int = 3,
          flops: bool | Collection[str] = True, timeout: float = 120):
    """Every case (keyword arguments of `measure`, e.g. ``{"every": 4}``; the first should be
    ``{"every": None}``, the reference for gradients) measured on `world_size` CPU ranks at once.

    A pandas DataFrame, one row per case: bytes kept at the end of forward (`saved`), by one
    segment rerun (`segment`) and their sum (`peak`), equal on every rank (checked); `flops` of
    one step as counted; `step_s` the median over ranks of each rank's best forward + backward,
    `spread_s` the max − min over ranks; `grad_diff` the largest difference from the first case's
    gradients.
    """
    if not cases:
        raise ValueError("sweep: give at least one case, e.g. [{'every': None}, {'every': 1}]")
    # FlopCounterMode imports torch._dynamo on its first count (seconds). Imported here, once,
    # the forked ranks inherit it instead of each paying for it on every sweep.
    import torch._dynamo  # noqa: F401

    results = spawn(_rank_sweep, world_size, model, inputs, targets, list(cases), repeats, flops,
                    timeout=timeout, echo=False)
    frame = pd.DataFrame([row for rows in results for row in rows])
    out = []
    for name, rows in frame.groupby("case", sort=False):
        for col in ("saved", "segment", "peak"):
            if rows[col].nunique() != 1:
                raise RuntimeError(f"sweep: ranks disagree on {col} for {name}: "
                                   f"{sorted(rows[col])}")
        steps = list(rows.forward_s + rows.backward_s)
        first = rows.iloc[0]
        out.append(dict(case=name, every=first.every, saved=int(first.saved),
                        segment=int(first.segment), peak=int(first.peak),
                        flops=rows.flops.dropna().iloc[0] if rows.flops.notna().any() else
                        float("nan"), step_s=statistics.median(steps),
                        spread_s=max(steps) - min(steps), grad_diff=rows.grad_diff.max()))
    return pd.DataFrame(out).set_index("case")
