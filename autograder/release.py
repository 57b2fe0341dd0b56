"""The student edition of a lab, generated from the one instructor source.

Solution regions are written once, in the lab's files (Python files and notebooks' code cells);
a region's lines, shown after a bar (a marker line here would itself be a region)::

    | ### BEGIN SOLUTION
    | ...the reference code...
    | ### END SOLUTION
    | ### HINT: a line the student sees instead
    | ### STUB: code the student gets instead of the raise (optional; e.g. ``answer = None``)

`release_lab` copies the lab folder without ``hidden/`` (listing only the names and points of
its checks in ``hidden_checks.json``, so a student's grade says what it lacks), without any
Markdown section whose heading starts ``## For instructors``, and replaces every region by a
``raise NotImplementedError(...)`` at the region's indentation, with its ``### HINT:`` lines
turned into ``# Hint:`` comments above it, or by its ``### STUB:`` lines where it has any (a
lesson's answer cell becomes ``answer = None``, so the notebook still runs top to bottom and
`toolkit.exercises` says what to fill in). nbgrader's convention, done with plain text so that
it works on any file. A region left open, or an END without BEGIN, is an error naming the file
and line: a release must never leak half a solution.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from .lab import HIDDEN_LIST

BEGIN, END, HINT, STUB = "### BEGIN SOLUTION", "### END SOLUTION", "### HINT:", "### STUB:"
INSTRUCTORS = "## For instructors"
"""A Markdown section whose heading starts so (``## For instructors: what it does not stop``),
up to the next ``## `` heading, is left out of every student edition."""
EXCLUDED = {"hidden", "__pycache__", ".ipynb_checkpoints"}


class MarkerError(ValueError):
    """Solution markers that do not pair up."""


def strip_solutions(text: str, where: str = "<text>") -> tuple[str, int]:
    """The text with every solution region replaced by a stub; returns (text, regions)."""
    out, inside, indent, regions, start = [], False, "", 0, 0
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped == BEGIN:
            if inside:
                raise MarkerError(f"{where}:{i}: {BEGIN} inside another region (opened at line "
                                  f"{start})")
            inside, indent, start = True, line[: len(line) - len(line.lstrip())], i
            continue
        if stripped == END:
            if not inside:
                raise MarkerError(f"{where}:{i}: {END} without {BEGIN}")
            inside, regions = False, regions + 1
            hints, stubs = _after(lines[i:])
            out += [f"{indent}# Hint: {h}\n" for h in hints]
            out += [f"{indent}{s}\n" for s in stubs] or [
                f"{indent}raise NotImplementedError(\"your code here\")\n"]
            continue
        if inside:
            continue
        if stripped.startswith((HINT, STUB)):
            continue  # emitted with its region's stub
        out.append(line)
    if inside:
        raise MarkerError(f"{where}:{start}: {BEGIN} is never closed")
    return "".join(out), regions


def _after(rest: list[str]) -> tuple[list[str], list[str]]:
    """The ``### HINT:`` and ``### STUB:`` lines right after a region (in any order)."""
    hints, stubs = [], []
    for line in rest:
        stripped = line.strip()
        if stripped.startswith(HINT):
            hints.append(stripped[len(HINT):].strip())
        elif stripped.startswith(STUB):
            code = stripped[len(STUB):].rstrip()
            stubs.append(code[1:] if code.startswith(" ") else code)  # keeps deeper indents
        else:
            break
    return hints, stubs


def drop_instructor_sections(text: str) -> str:
    """Markdown without its ``## For instructors...`` sections (fenced code is not a heading)."""
    out, skipping, fenced = [], False, False
    for line in text.splitlines(keepends=True):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if line.startswith("## ") and not fenced:
            skipping = line.startswith(INSTRUCTORS)
        if not skipping:
            out.append(line)
    return "".join(out).rstrip() + "\n"


def release_file(src: Path, dst: Path, where: str) -> int:
    """Write the student edition of one file; returns the solution regions it stubbed.
    Python: regions stubbed; notebooks: code cells' regions stubbed, outputs cleared; Markdown:
    instructors' sections left out; anything else copied."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.suffix == ".py":
        text, n = strip_solutions(src.read_text(), where)
        dst.write_text(text)
        return n
    if src.suffix == ".ipynb":
        text, n = _notebook(src)
        dst.write_text(text)
        return n
    if src.suffix == ".md":
        dst.write_text(drop_instructor_sections(src.read_text()))
    else:
        shutil.copy2(src, dst)
    return 0


def _notebook(path: Path) -> tuple[str, int]:
    nb = json.loads(path.read_text())
    regions = 0
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        new, n = strip_solutions(source, f"{path.name} cell {cell.get('id', '?')}")
        regions += n
        cell["source"] = new.splitlines(keepends=True)
        cell["outputs"], cell["execution_count"] = [], None
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n", regions


def release_lab(lab_dir: Path, out_dir: Path, *, force: bool = False) -> dict[str, int]:
    """Write the student edition of `lab_dir` into `out_dir`; returns regions stubbed per file."""
    lab_dir, out_dir = Path(lab_dir).resolve(), Path(out_dir).resolve()
    if not (lab_dir / "checks.py").is_file():
        raise ValueError(f"{lab_dir} is not a lab folder (it has no checks.py)")
    if out_dir == lab_dir or lab_dir in out_dir.parents:
        raise ValueError(f"--out {out_dir} must be outside the lab folder {lab_dir}")
    if out_dir.exists():
        if not force:
            raise FileExistsError(f"{out_dir} exists; pass --force to replace it")
        shutil.rmtree(out_dir)
    stubbed: dict[str, int] = {}
    for src in sorted(lab_dir.rglob("*")):
        rel = src.relative_to(lab_dir)
        if any(part in EXCLUDED for part in rel.parts) or src.is_dir():
            continue
        n = release_file(src, out_dir / rel, str(rel))
        if n:
            stubbed[str(rel)] = n
    hidden = _hidden_list(lab_dir)
    if hidden is not None:
        (out_dir / HIDDEN_LIST).write_text(hidden)
    return stubbed


def _hidden_list(lab_dir: Path) -> str | None:
    """hidden_checks.json: the hidden checks' names and points (never their code or cases)."""
    if not (lab_dir / "hidden" / "checks.py").is_file():
        return None
    from .lab import load_lab  # imports the lab's harness (torch): only when there is a list

    lab = load_lab(lab_dir)
    checks = [{"name": c.name, "points": c.points} for c in lab.checks if not c.visible]
    return json.dumps({"about": "The hidden checks of this lab, which the instructor's grader "
                       "runs: names and points only.", "checks": checks}, indent=1) + "\n"


def solution_lines(lab_dir: Path) -> list[str]:
    """Every non-trivial line inside a solution region (to prove a release holds none)."""
    found = []
    for src in Path(lab_dir).rglob("*"):
        if src.suffix not in (".py", ".ipynb") or "hidden" in src.parts:
            continue
        text = src.read_text()
        for block in re.findall(rf"{re.escape(BEGIN)}\n(.*?){re.escape(END)}", text, re.S):
            for line in block.replace("\\n", "\n").splitlines():
                line = line.strip().strip('",')
                if len(line) > 12 and not line.startswith("#"):
                    found.append(line)
    return found


__all__ = ["MarkerError", "drop_instructor_sections", "release_file", "release_lab",
           "solution_lines", "strip_solutions"]
