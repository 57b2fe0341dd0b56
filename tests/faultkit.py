"""Helpers for the fault corpus: a fault's submission (the reference solution with the fault's
code appended, so the later definitions win), a small lab built from the visible checks, one
grade with its results.json validated, and the assertions every fault test makes.

Grades run on a small lab (a few visible checks, 1-2 cases each) to keep each test at a few
seconds: what is under test is the grader, not the lab's coverage. Checks meant to hang get an
8 s timeout, long enough for every rank of a loaded laptop to reach the place the report names;
the others keep a generous one so that a busy machine cannot turn a correct check into a
timeout. Nothing here asserts how long a grade took or which line a rank had reached when the
timing decides it.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import time
from pathlib import Path

import psutil

from autograder.failures import KINDS
from autograder.grade import grade
from autograder.lab import Lab, load_lab
from autograder.report import to_results_json, to_text, validate_results
from autograder.sandbox.limits import Limits

ROOT = Path(__file__).resolve().parent.parent
FAULTS = ROOT / "tests" / "faults" / "01_collectives"
REFERENCE = ROOT / "labs" / "01_collectives" / "collectives.py"
HANG_S = 8.0      # timeout of a check that is meant to hang (ranks of a busy machine get there)
SAFE_S = 30.0     # timeout of a check that is meant to finish
LIMITS = Limits(wall_s=120, processes=64)


def _case(p: int, n: int, seed: int, **extra) -> dict:
    return {"world_size": p, "dtype": "float32", "seed": seed, "numel": n, **extra}


# Small checks built from lab 01's visible ones (same judges, fewer cases): name → (index in
# the visible checks, cases or None to keep them).
SMALL = {
    "ar": (0, (_case(2, 8, 0),)),             # ring_all_reduce values, 2 ranks
    "ar4": (0, (_case(4, 8, 1),)),            # ring_all_reduce values, 4 ranks
    "ring": (1, (_case(2, 4096, 20),)),       # ring_all_reduce traffic (with values first)
    "ring4": (1, (_case(4, 4096, 21),)),      # the same at 4 ranks (a star differs from a ring)
    "bcast": (2, (_case(3, 100, 30, src=1),)),
    "tree": (3, None),                        # binomial-tree traffic, 4 ranks, 2 roots
    "ag": (5, (_case(4, 12, 70),)),           # ring_all_gather values, 4 ranks
}


def small_lab(lab: Lab, names: list[str], hang: set[str] = frozenset()) -> Lab:
    checks = []
    for name in names:
        index, cases = SMALL[name]
        check = lab.checks[index]
        checks.append(dataclasses.replace(check, cases=cases or check.cases,
                                          timeout=HANG_S if name in hang else SAFE_S))
    return dataclasses.replace(lab, checks=checks)


def survivors(folder: Path) -> list[str]:
    """Processes anywhere on the machine whose command line or working folder is in `folder`
    (a rank's working folder is its grade's code folder)."""
    out = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if str(folder) in " ".join(p.info["cmdline"] or []) or \
                    p.cwd().startswith(str(folder)):
                out.append(f"{p.info['pid']} {p.info['status']}")
        except psutil.Error:
            pass
    return out


def wait_gone(folder: Path, tries: int = 300) -> list[str]:
    """`survivors(folder)` once they are gone or after `tries` × 0.1 s: a rank's exit is seen a
    little later on a loaded machine, so a test waits for the invariant rather than timing it."""
    for _ in range(tries):
        left = survivors(folder)
        if not left:
            return left
        time.sleep(0.1)
    return survivors(folder)


def source(fault: str, reference: Path = REFERENCE, folder: Path = FAULTS) -> str:
    return reference.read_text() + f"\n\n# ---- fault: {fault} ----\n\n" + \
        (folder / f"{fault}.py").read_text()


def submission(fault: str, folder: Path, *, text: str | None = None,
               name: str = "collectives.py") -> Path:
    """The fault's submission: the reference solution followed by the fault's code."""
    path = folder / fault / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source(fault) if text is None else text)
    return path


def line_of(fault: str, text: str) -> int:
    """The line number of `text` in the fault's submission, searched in the fault's part."""
    lines = source(fault).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# ---- fault:"))
    return next(i for i, line in enumerate(lines, 1) if i > start and text in line)


RING = ("exchange", "ring_reduce_scatter", "ring_all_gather", "ring_all_reduce")


def ring_lines(fault: str) -> str:
    """A regex matching any line of the ring's functions as the fault's submission defines them
    (the last definition of a name wins, as when Python runs the file): which of them a waiting
    rank was in can be up to timing."""
    spans = {}
    for node in ast.parse(source(fault)).body:
        if isinstance(node, ast.FunctionDef) and node.name in RING:
            spans[node.name] = range(node.lineno, node.end_lineno + 1)
    return "(?:" + "|".join(str(n) for span in spans.values() for n in span) + r")\b"


def run_grade(lab: Lab, path: Path, tmp_path: Path, *, limits: Limits = LIMITS, **options):
    """Grade `path` with `lab` (`options`: grade's device and gpus); check results.json and
    that nothing of the grade survives."""
    work = tmp_path / "runs"
    work.mkdir(exist_ok=True)
    result = grade(lab, path, limits=limits, workbase=work, **options)
    data = to_results_json(result)
    assert validate_results(data) == [], data
    json.dumps(data)  # plain JSON all the way down
    assert not survivors(work), f"processes of the grade still running: {survivors(work)}"
    assert list(work.iterdir()) == [], "the grade's folder was left behind"
    return result, data


def run_fault(lab: Lab, fault: str, names: list[str], tmp_path: Path, *,
              hang: set[str] = frozenset(), limits: Limits = LIMITS, text: str | None = None,
              **options):
    small = small_lab(lab, names, hang)
    result, _ = run_grade(small, submission(fault, tmp_path / "submissions", text=text),
                          tmp_path, limits=limits, **options)
    return result, dict(zip(names, result.checks))


def grade_fault_on_check(lab_dir: Path, faults: Path, fault: str, prefix: str, tmp_path: Path):
    """A lab's fault file (its reference with the fault appended) graded on the first case of
    the one visible check whose name starts with `prefix`; that check's result."""
    return grade_fault_on_checks(lab_dir, faults, fault, [prefix], tmp_path)[0]


def grade_fault_on_checks(lab_dir: Path, faults: Path, fault: str, prefixes: list[str],
                          tmp_path: Path) -> list:
    """The same on the first case of each visible check named by a prefix, in one grade: the
    checks' results in the order of `prefixes`."""
    lab = load_lab(lab_dir, hidden=False)
    checks = [next(c for c in lab.checks if c.name.startswith(prefix)) for prefix in prefixes]
    small = dataclasses.replace(lab, checks=[
        dataclasses.replace(check, cases=check.cases[:1], timeout=60.0) for check in checks])
    student = lab.info.student_files[0]
    text = source(fault, lab_dir / student, faults)
    result, _ = run_grade(small, submission(fault, tmp_path / "subs", text=text, name=student),
                          tmp_path)
    return result.checks


def assert_failed(check, kind: str, *says: str) -> None:
    assert kind in KINDS
    assert (check.score, check.passed, check.kind) == (0, 0, kind), (check.kind, check.message)
    for text in says:
        assert re.search(text, check.message), f"{text!r} not in {check.message!r}"


def assert_passed(check) -> None:
    assert check.ok and check.score == check.check.points, (check.kind, check.message)


def assert_fault(lab_dir: Path, faults: Path, fault: str, want: dict, tmp_path: Path) -> None:
    """`grade_fault_on_checks` on `want`'s checks (name prefixes), each result against its
    entry: (passes, regexes its message must match when it fails, as wrong_result)."""
    got = grade_fault_on_checks(lab_dir, faults, fault, list(want), tmp_path)
    for check, (passes, says) in zip(got, want.values(), strict=True):
        if passes:
            assert_passed(check)
        else:
            assert_failed(check, "wrong_result", *says)


def report_text(result) -> str:
    return to_text(result) + json.dumps(to_results_json(result))


__all__ = ["FAULTS", "HANG_S", "LIMITS", "REFERENCE", "RING", "ROOT", "SMALL", "assert_failed",
           "assert_fault",
           "assert_passed", "grade_fault_on_check", "grade_fault_on_checks", "line_of",
           "report_text", "ring_lines", "run_fault", "run_grade", "small_lab", "source",
           "submission", "survivors"]
