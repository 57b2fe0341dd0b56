"""What the grader asks the sandbox to run: a grade's shared settings (`Job`), its launches
(`LaunchPlan`, one per check and world size) and their cases (`CasePlan`, with every rank's
inputs, which the courier hands out one rank at a time)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..protocol import GroupKey


@dataclass
class CasePlan:
    """One case as the courier hands it out: the harness call, the public parameters, and
    each rank's inputs (made by the grader; a rank receives only its own)."""

    index: int
    call: str
    params: dict
    inputs: list[Any]
    gate: str = ""
    """The case's gate key (`autograder.sandbox.gate.case_key`, from the grade's secret; never
    sent to a rank); empty: the public `gate.LOCAL_KEY` schedule (courier tests)."""


@dataclass
class Job:
    """What every launch of one grade shares."""

    module: str
    code: Path
    allowed: frozenset[str]
    refusal: str
    """The words for a refused collective, with ``{op}`` where its name goes."""
    forbidden: list[str] = field(default_factory=list)
    toolkit: list[str] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)
    landlock: bool = True
    seccomp: bool = True
    unconfined: bool = False
    """``grade --unconfined`` only: ranks without their own worlds, uids and namespaces (what the
    host gives an unprivileged user); the report says loudly that the grade is not sandboxed.
    Never set by batch or Gradescope."""
    device: str = "cpu"
    """"cpu" or "cuda" (`autograder.devices`): rank r of a cuda grade uses GPU r of `gpus`."""
    gpus: str = ""
    """The grade's GPU set as CUDA_VISIBLE_DEVICES lists it ("" on cpu)."""


@dataclass
class LaunchPlan:
    key: GroupKey
    timeout: float
    cases: list[CasePlan]


__all__ = ["CasePlan", "Job", "LaunchPlan"]
