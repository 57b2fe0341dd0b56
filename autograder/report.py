"""A grade as Gradescope's results.json and as a report a student reads in a terminal.

results.json follows Gradescope's autograder specification ("Autograder specifications ->
Output format"): top-level ``score``, ``execution_time`` (seconds), ``output``, ``visibility``,
``stdout_visibility`` and ``tests``, each test with ``name``, ``score``, ``max_score``,
``status`` ("passed" / "failed"), ``output`` and ``visibility``. Hidden checks are
``after_published`` (students see them once the instructor publishes grades). The failure kind
goes in each test's ``tags`` and ``extra_data``, so instructors can filter and count them.

Writing is atomic (temporary file + rename): a crash while writing never leaves half a file.
Every message may quote a rank (its exception, its output): both forms pass it through
`autograder.sanitize.printable`, so no escape sequence reaches a terminal or a browser raw.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from .sandbox.summary import UNCONFINED
from .failures import KINDS
from .grade import GradeResult
from .sanitize import printable

REQUIRED_TOP = {"score": (int, float), "execution_time": (int, float), "output": str,
                "tests": list}
REQUIRED_TEST = {"name": str, "score": (int, float), "max_score": (int, float), "status": str,
                 "output": str, "visibility": str}
VISIBILITIES = {"hidden", "after_due_date", "after_published", "visible"}


def _test_output(c) -> str:
    lines = [c.check.about] if c.check.about else []
    lines.append(f"{c.passed} of {c.total} cases passed.")
    if c.kind and c.message:
        lines.append(f"[{c.kind}] {printable(c.message)}")
    return "\n".join(lines)


def to_results_json(result: GradeResult) -> dict:
    tests = []
    for i, c in enumerate(result.checks, 1):
        test = {"name": c.check.name, "number": str(i), "score": c.score,
                "max_score": c.check.points, "status": "passed" if c.ok else "failed",
                "output": _test_output(c),
                "visibility": "visible" if c.check.visible else "after_published"}
        if c.kind:
            test["tags"] = [c.kind]
            test["extra_data"] = {"kind": c.kind}
        tests.append(test)
    summary = [f"{result.lab.info.title}: {result.score:g} / {result.max_score:g} points."]
    summary += [printable(line) for line in _head(result)]
    summary += [printable(n) for n in result.notes]
    return {"score": result.score, "execution_time": round(result.seconds, 1),
            "output": "\n".join(summary), "visibility": "visible",
            "stdout_visibility": "hidden", "tests": tests,
            "extra_data": {"lab": result.lab.info.slug, "sandbox": result.sandbox}}


def validate_results(data: dict) -> list[str]:
    """Problems with a results.json against Gradescope's fields (empty when valid)."""
    problems = []
    for key, types in REQUIRED_TOP.items():
        if not isinstance(data.get(key), types):
            problems.append(f"top-level {key!r} missing or not {types}")
    for i, test in enumerate(data.get("tests") or []):
        for key, types in REQUIRED_TEST.items():
            if not isinstance(test.get(key), types):
                problems.append(f"tests[{i}].{key} missing or not {types}")
        if test.get("status") not in ("passed", "failed"):
            problems.append(f"tests[{i}].status is {test.get('status')!r}")
        if test.get("visibility") not in VISIBILITIES:
            problems.append(f"tests[{i}].visibility is {test.get('visibility')!r}")
        if isinstance(test.get("score"), (int, float)) and \
                isinstance(test.get("max_score"), (int, float)):
            if not 0 <= test["score"] <= test["max_score"]:
                problems.append(f"tests[{i}].score {test['score']} outside 0..{test['max_score']}")
    if isinstance(data.get("score"), (int, float)) and data.get("tests"):
        total = sum(t.get("score", 0) for t in data["tests"])
        if abs(total - data["score"]) > 1e-6:
            problems.append(f"score {data['score']} is not the sum of the tests' scores {total}")
    return problems


def write_results(result: GradeResult, path: Path) -> dict:
    """Write results.json atomically; returns what was written."""
    data = to_results_json(result)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".results-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return data


def _head(result: GradeResult) -> list[str]:
    """What was graded, and the problem that stopped every check (said once, here)."""
    lines = [f"Graded {name}: {path}" for name, path in result.files.items()]
    if result.notes and result.notes[0].startswith(UNCONFINED):
        lines.insert(0, result.notes[0])  # first of all: this grade was not sandboxed
    if result.problem:
        lines += [f"Not graded ({result.problem.kind}): {result.problem.message}"]
    return lines


def to_text(result: GradeResult, *, color: bool = False) -> str:
    """The report a student reads: what was graded, one line per check, then what went wrong,
    in words. A problem that stopped every check is said once, above them."""
    green, red, dim, end = ("\033[32m", "\033[31m", "\033[2m", "\033[0m") if color else ("",) * 4
    lines = [f"{result.lab.info.title}: {result.score:g} / {result.max_score:g} points "
             f"({result.seconds:.1f} s)"]
    lines += [printable(line) for line in _head(result)] + [""]
    if result.problem:  # nothing ran: one line, not the same words under every check
        lines.append(f"None of the {len(result.checks)} checks ran.")
    for c in result.checks if not result.problem else ():
        mark = f"{green}PASS{end}" if c.ok else f"{red}FAIL{end}"
        hidden = "" if c.check.visible else f" {dim}(hidden){end}"
        lines.append(f"  {mark}  {c.score:>5g} / {c.check.points:<4g} {c.check.name}{hidden}"
                     f"  {dim}[{c.passed}/{c.total} cases]{end}")
        if not c.ok and c.message:
            why = KINDS.get(c.kind or "", "")
            lines.append(f"        {c.kind}{': ' + why if why else ''}")
            lines += [f"        {line}" for line in printable(c.message).splitlines()]
    notes = [n for n in result.notes if not n.startswith(UNCONFINED)]  # said at the top
    if notes:
        lines += [""] + [f"Note: {printable(n)}" for n in notes]
    return "\n".join(lines)


__all__ = ["to_results_json", "to_text", "validate_results", "write_results"]
