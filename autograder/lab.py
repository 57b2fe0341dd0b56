"""What a lab is, to the grader: its student files, the names it calls, and its checks.

A lab folder (``labs/NN_slug/``) holds:

* ``README.md``: the assignment;
* the student file(s) (``LAB.student_files``), written once with solution regions
  (``### BEGIN SOLUTION`` … ``### END SOLUTION``) that `autograder release` replaces with stubs;
* ``harness.py``: how inputs are made (``make_inputs(case, world_size)``, one entry per rank,
  run here in the grader with the case's seed drawn from a per-grade secret) and the calls the
  ranks make (``CALLS[name](student_module, call) -> output``, where `call` is an
  `autograder.sandbox.probe.Call`: rank, world size, the case's public parameters and this
  rank's inputs alone); copied into the sandbox for the calls;
* ``checks.py``: ``LAB`` (a `LabInfo`), ``CHECKS`` (the visible `Check` list) and ``OUTPUTS``
  (call name → the form of a rank's result, `autograder.outputs`: checked before any judge);
* ``hidden/checks.py`` (instructors only; `release` leaves it out, listing only the names and
  points of its checks in ``hidden_checks.json``): more ``CHECKS``;
* a playground notebook.

A `Check` is decided in the grader process by its ``judge``, a function of a `CaseResult`
returning `Verdict`; its cases run on real ranks in the sandbox, grouped by world size. A
case's traffic (`autograder.protocol.RankTraffic`) is what the grader's courier saw, never what
a rank says.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from .outputs import Form
from .protocol import RankTraffic, Verdict, canonical_op
from .sandbox.rank import load_module
from .sandbox.reduce import COLLECTIVES


@dataclass
class CaseResult:
    """One case as the judge sees it: parameters, inputs, and what each rank did."""

    case: dict
    """The case's parameters, with the seed the grader drew for it from the grade's secret."""
    world_size: int
    inputs: list[Any]
    """Per rank, the inputs the grader made and sent to it (`harness.make_inputs`)."""
    outputs: list[Any]
    """Per rank, the decoded output (tensors are real tensors again)."""
    traffic: list[RankTraffic]
    """Per rank, what the courier saw it send and receive during the case: messages (with
    their bytes), collectives, and the harness's marks and sections."""


def one_row_each(rows: Any, count: int, what: str) -> Verdict | None:
    """A failed verdict unless `rows` (a rank's output) is a list of `count` dicts, one per
    `what` (e.g. "(n, p) pair") the case asks for; None when it is. A judge then reads each
    row's answers only, with the parameters taken from the case (never from the rows)."""
    if isinstance(rows, list) and len(rows) == count and all(isinstance(r, dict) for r in rows):
        return None
    got = f"{len(rows)} rows" if isinstance(rows, list) else str(rows)[:80]
    return Verdict(False, f"expected one result per {what}, {count} in all; got {got}")


@dataclass(frozen=True)
class Check:
    """One graded check: a name students read, points, the harness call, cases and a judge."""

    name: str
    points: float
    call: str
    cases: tuple[dict, ...]
    """Each case: ``world_size`` plus JSON-able parameters for the call (numel, dtype, seed...)."""
    judge: Callable[[CaseResult], Verdict]
    visible: bool = True
    timeout: float = 15.0
    """Seconds for one world size's cases together (one launch)."""
    about: str = ""
    """One line saying what the check checks, shown in the report."""

    def __post_init__(self) -> None:
        if self.points < 0:
            raise ValueError(f"Check {self.name!r}: points must be >= 0, got {self.points}")
        if not self.cases:
            raise ValueError(f"Check {self.name!r}: needs at least one case")
        for case in self.cases:
            if not isinstance(case.get("world_size"), int) or case["world_size"] < 1:
                raise ValueError(f"Check {self.name!r}: every case needs world_size >= 1, "
                                 f"got {case}")


@dataclass(frozen=True)
class LabInfo:
    slug: str
    title: str
    student_files: tuple[str, ...]
    """Files a submission must contain, e.g. ``("collectives.py",)``; the first is imported."""
    names: tuple[str, ...]
    """The seam: functions or classes the checks call in the student's module."""
    forbidden_imports: tuple[str, ...] = ()
    """Modules the ranks refuse to import (e.g. the toolkit's own solution)."""
    allowed_collectives: tuple[str, ...] = ()
    """torch.distributed collectives the student's code may call (e.g. ``"all_reduce"`` in a
    DDP lab; an alias counts as its operation: ``all_gather_into_tensor`` allows
    ``all_gather_single`` and the reverse); any other is refused by the courier and fails the
    case (kind builtin_collective)."""
    sandbox_modules: tuple[str, ...] = ()
    """`toolkit` modules the ranks may read besides the launcher and recorder, e.g.
    ``("models",)`` for a harness that builds the tiny models in each rank. Never the module
    that holds the lab's answer."""
    devices: tuple[str, ...] = ("cpu", "cuda")
    """Where its ranks may run (``grade --device``): "cuda" gives each rank one GPU; a lab
    whose ranks hold no tensors worth a GPU says ``("cpu",)``."""

    def __post_init__(self) -> None:
        unknown = [n for n in self.allowed_collectives if canonical_op(n) not in COLLECTIVES]
        if unknown:
            raise ValueError(f"LabInfo({self.slug!r}).allowed_collectives: the grader's courier "
                             f"cannot run {unknown}; it runs {sorted(COLLECTIVES)}")

    @property
    def allowed_ops(self) -> frozenset[str]:
        """The process-group operations the courier runs for this lab."""
        return frozenset(canonical_op(n) for n in self.allowed_collectives)

    def refusal(self) -> str:
        """What a refused collective is told (``{op}`` is its name)."""
        if not self.allowed_collectives:
            return ("torch's built-in {op} is not allowed in this lab: build it from send/recv "
                    "(or isend/irecv) only")
        return (f"torch's built-in {{op}} is not allowed in this lab (it allows "
                f"{', '.join(self.allowed_collectives)})")


@dataclass
class Lab:
    info: LabInfo
    path: Path
    checks: list[Check]
    harness: ModuleType
    hidden_loaded: bool = False
    hidden_listed: list[tuple[str, float]] = field(default_factory=list)
    """A student edition's list of the hidden checks it lacks (name, points), from the
    release's ``hidden_checks.json``: the report says what the instructor's grade adds."""
    outputs: dict[str, Form] = field(default_factory=dict)
    """Call name → the form of a rank's result (checks.py's ``OUTPUTS``; `autograder.outputs`):
    every result is checked against it before its judge reads it."""

    @property
    def module(self) -> str:
        return Path(self.info.student_files[0]).stem

    @property
    def max_score(self) -> float:
        return sum(c.points for c in self.checks)


HIDDEN_LIST = "hidden_checks.json"
"""In a released lab: the names and points of the hidden checks left out (never their code)."""


def _is_path(name: str) -> bool:
    return name.startswith((".", "~")) or "/" in name or "\\" in name


def find_lab(name_or_path: str | Path, labs_root: Path | None = None) -> Path:
    """A lab folder: a slug such as ``01_collectives`` (or ``collectives``, or ``01``) is looked
    up in the labs root only, never in the current folder (a student copy named like the lab
    there has no hidden checks); a path (``./x``, ``a/b``, absolute, or a `Path`) is taken as
    given."""
    root = labs_root or Path(__file__).resolve().parent.parent / "labs"
    if isinstance(name_or_path, Path) or _is_path(str(name_or_path)):
        path = Path(name_or_path).expanduser()
        if (path / "checks.py").is_file():
            return path.resolve()
        raise ValueError(f"{path} is not a lab folder (no checks.py in it)")
    matches = sorted(p for p in root.glob("*/checks.py")
                     if p.parent.name == str(name_or_path)
                     or p.parent.name.endswith(f"_{name_or_path}")
                     or p.parent.name.startswith(f"{name_or_path}_"))
    if len(matches) == 1:
        return matches[0].parent
    known = ", ".join(sorted(p.parent.name for p in root.glob("*/checks.py"))) or "none"
    raise ValueError(f"no lab {str(name_or_path)!r}: give a lab folder (one with checks.py) or "
                     f"one of: {known}")


def load_lab(path: Path, *, hidden: bool = True) -> Lab:
    """Import a lab's harness and checks (and hidden checks, where present and wanted)."""
    path = Path(path).resolve()
    tag = f"_autograder_lab_{path.name}"
    harness = load_module(path / "harness.py", f"{tag}_harness")
    sys.modules["_lab_harness"] = harness  # checks.py imports it by this name, as ranks do
    checks_mod = load_module(path / "checks.py", f"{tag}_checks")
    checks = list(checks_mod.CHECKS)
    hidden_path = path / "hidden" / "checks.py"
    hidden_loaded = hidden and hidden_path.is_file()
    if hidden_loaded:
        hidden_checks = list(load_module(hidden_path, f"{tag}_hidden").CHECKS)
        checks += [Check(**{**c.__dict__, "visible": False}) for c in hidden_checks]
    listed = []
    if not hidden_path.is_file() and (path / HIDDEN_LIST).is_file():
        listed = [(str(c["name"]), float(c["points"]))
                  for c in json.loads((path / HIDDEN_LIST).read_text())["checks"]]
    return Lab(checks_mod.LAB, path, checks, harness, hidden_loaded, listed,
               dict(getattr(checks_mod, "OUTPUTS", {})))


__all__ = ["CaseResult", "Check", "Lab", "LabInfo", "Verdict", "find_lab", "load_lab",
           "one_row_each"]
