"""The student edition of the whole course, generated from this (the instructor's) repository.

Two repositories, as nbgrader and otter-grader users keep them: this one is the instructor's
(keep it private: the labs' reference solutions, the lessons' exercise answers, the hidden
checks, the test suite), and the student edition it generates is the one to publish. Binder,
nbgitpuller links, a class's JupyterHub image and the website all open the student edition:

    autograder release --course --out DIR       the student repository (DIR must not exist)
    autograder release --workspace --out DIR    its lessons and labs only, for `make lab`:
                                                adds what is missing, never overwrites a file

What the student edition holds (`COURSE`): every lesson (exercise regions replaced by their
``### STUB:`` lines, outputs cleared), every lab as `release_lab` writes it (stubs and hints, no
``hidden/``, the hidden checks' names and points only), the toolkit and the grader (so a
student grades locally: `autograder grade .` in a lab folder runs the visible checks and names
the hidden ones), the benchmarks a lesson points to, ``binder/``, ``docs/``, the README and the
Makefile. Every Markdown section headed ``## For instructors...`` is left out, as are the
Makefile's lines between ``# BEGIN INSTRUCTORS ONLY`` and ``# END INSTRUCTORS ONLY`` (the
test suite's and the website's targets). Left out entirely (`LEFT_OUT`, with why): the tests,
the website's build, CI, the instructors' pages (teaching, a class's JupyterHub), and the
benchmarks that grade the reference solutions.

The repository that Binder badges and the website's links name is one setting,
``student-repository`` in pyproject.toml's ``[tool.course]`` table (GitHub ``OWNER/NAME`` of
the published student edition). Unset (the default), no Binder link is written anywhere and
the release and the site build say so.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .release import (BEGIN, END, EXCLUDED, HINT, STUB, drop_instructor_sections, release_file,
                      release_lab)

ROOT = Path(__file__).resolve().parent.parent

COURSE = ("README.md", "Makefile", "pyproject.toml", ".gitignore", "binder", "scripts", "docs",
          "lessons", "labs", "toolkit", "autograder", "benchmarks")
"""What the student repository holds (a file or a folder of this repository)."""
WORKSPACE = ("lessons", "labs")
"""What `make lab`'s workspace holds: the student's own copies (toolkit and grader are the
installed ones)."""
LEFT_OUT = {
    "tests": "the suite grades the reference solutions and holds the fault corpus",
    "conftest.py": "the suite's",
    "website": "the instructor builds the site (from the student edition) and publishes it",
    ".github": "the site's workflow, run from the instructor's repository",
    ".ci": "the suite's",
    "docs/teaching.md": "for instructors: the two repositories, publishing, grading a class",
    "docs/jupyterhub.md": "for instructors: a class's hub, built from the student edition",
    "benchmarks/grading.py": "grades the reference solutions and the tests' fault corpus",
    "benchmarks/grader_footprint.py": "grades the reference solutions",
    "benchmarks/gpu_check.py": "runs the test suite's GPU tests",
    "benchmarks/grade_timeout.py": "grades the tests' fault corpus",
    "benchmarks/cluster_paths.py": "runs the test suite's SLURM and torchrun tests",
    "benchmarks/pytest_phases.py": "cluster_paths.py's pytest plugin",
}
"""Paths of this repository the student edition does not hold, and why."""

INSTRUCTORS_BEGIN, INSTRUCTORS_END = "# BEGIN INSTRUCTORS ONLY", "# END INSTRUCTORS ONLY"
BADGE = "<!-- binder badge -->"
"""README's line that becomes the Binder badge of the student repository (or nothing)."""
_REPO = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")


def student_repository(root: Path = ROOT) -> str | None:
    """pyproject.toml's ``[tool.course] student-repository`` (OWNER/NAME), or None when unset."""
    text = (Path(root) / "pyproject.toml").read_text()
    try:
        import tomllib

        value = tomllib.loads(text).get("tool", {}).get("course", {}).get("student-repository")
    except ModuleNotFoundError:  # Python 3.10: one flat string in one table, read by pattern
        table = re.search(r"^\[tool\.course\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
        found = table and re.search(r'^student-repository\s*=\s*"([^"]*)"', table.group(1),
                                    re.M)
        value = found.group(1) if found else None
    if not value:
        return None
    if not isinstance(value, str) or not _REPO.fullmatch(value):
        raise ValueError(f"pyproject.toml [tool.course] student-repository = {value!r}: expected "
                         'the GitHub OWNER/NAME of the published student edition, or "" (unset)')
    return value


def binder_url(repo: str, path: str = "lessons/README.md") -> str:
    """A Binder launch of `repo` (OWNER/NAME on GitHub) that opens `path` in JupyterLab."""
    return f"https://mybinder.org/v2/gh/{repo}/HEAD?urlpath=lab/tree/{path}"


def _readme(text: str, repo: str | None) -> str:
    badge = (f"[![Launch on Binder](https://mybinder.org/badge_logo.svg)]({binder_url(repo)})"
             if repo else "")
    lines = drop_instructor_sections(text).splitlines(keepends=True)
    out = []
    for i, line in enumerate(lines):
        if line.strip() == BADGE:
            if badge:
                out.append(badge + "\n")
            elif i + 1 < len(lines) and not lines[i + 1].strip():
                lines[i + 1] = ""  # no badge: no empty paragraph either
        else:
            out.append(line)
    return "".join(out)


def _makefile(text: str) -> str:
    out, inside = [], False
    for i, line in enumerate(text.splitlines(keepends=True), 1):
        if line.strip() == INSTRUCTORS_BEGIN:
            if inside:
                raise ValueError(f"Makefile:{i}: {INSTRUCTORS_BEGIN} inside another region")
            inside = True
        elif line.strip() == INSTRUCTORS_END:
            if not inside:
                raise ValueError(f"Makefile:{i}: {INSTRUCTORS_END} without {INSTRUCTORS_BEGIN}")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError(f"Makefile: {INSTRUCTORS_BEGIN} is never closed")
    return "".join(out)


@dataclass
class Written:
    """What a release wrote: files, solution regions stubbed, and notes for the instructor."""

    files: int = 0
    regions: int = 0
    notes: list[str] = field(default_factory=list)


def _outside(out: Path, root: Path) -> None:
    """Refuse an --out that is the course, holds it, or lies in a part the edition copies."""
    inside = [part for part in COURSE if (root / part) == out or (root / part) in out.parents]
    if out == root or out in root.parents or inside:
        raise ValueError(f"--out {out}: expected a folder of its own, not the course folder "
                         f"{root}, one above it or one in what the edition copies "
                         f"({', '.join(inside) or 'the course'}); e.g. {root}/workspace")


def _left_out(rel: str) -> bool:
    return any(rel == p or rel.startswith(p + "/") for p in LEFT_OUT)


def _write_tree(root: Path, out: Path, parts: tuple[str, ...], repo: str | None) -> Written:
    done = Written()
    for part in parts:
        src = root / part
        if part == "labs":
            for lab in sorted(p.parent for p in src.glob("*/checks.py")):
                done.regions += sum(release_lab(lab, out / "labs" / lab.name).values())
            files = [p for p in src.glob("*") if p.is_file()]
        else:
            files = [src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file())
        for path in files:
            rel = path.relative_to(root).as_posix()
            if _left_out(rel) or EXCLUDED & set(Path(rel).parts):
                continue
            dst = out / rel
            if rel == "README.md":
                dst.write_text(_readme(path.read_text(), repo))
            elif rel == "Makefile":
                dst.write_text(_makefile(path.read_text()))
            else:
                done.regions += release_file(path, dst, rel)
    _unlink_left_out(out)
    done.files = sum(1 for p in out.rglob("*") if p.is_file())
    return done


_LINK = re.compile(r"\[([^\]]+)\]\(\s*<?([^)\s>]+)>?\s*\)")


def _unlink_left_out(out: Path) -> None:
    """A Markdown link to a file the edition leaves out (a benchmark that grades the reference,
    the tests) becomes its text: the edition holds no link that goes nowhere."""
    def keep(m: re.Match, here: Path) -> str:
        target = m.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            return m.group(0)
        return m.group(0) if (here / target.split("#")[0]).exists() else m.group(1)

    for page in out.rglob("*.md"):
        text = page.read_text()
        new = _LINK.sub(lambda m, here=page.parent: keep(m, here), text)
        if new != text:
            page.write_text(new)


def release_course(out: Path, *, root: Path = ROOT, force: bool = False) -> Written:
    """Write the student repository into `out` (module docstring); refuses an existing `out`
    unless `force`: then everything in it is replaced but its ``.git`` (the published
    repository's checkout: commit and push the new edition from there)."""
    root, out = Path(root).resolve(), Path(out).resolve()
    _outside(out, root)
    if out.exists():
        if not force:
            raise FileExistsError(f"{out} exists; pass --force to replace it")
        for old in out.iterdir():
            if old.name != ".git":
                shutil.rmtree(old) if old.is_dir() and not old.is_symlink() else old.unlink()
    out.mkdir(parents=True, exist_ok=True)
    repo = student_repository(root)
    done = _write_tree(root, out, COURSE, repo)
    if repo is None:
        done.notes.append("no Binder badge: set student-repository = \"OWNER/NAME\" (where you "
                          "publish this edition) under [tool.course] in pyproject.toml")
    return done


def release_workspace(out: Path, *, root: Path = ROOT) -> tuple[int, int]:
    """`make lab`'s workspace: the student edition's lessons and labs copied into `out`, file
    by file, where no file of that name is yet: a student's work is never overwritten (delete
    a file to get a fresh copy on the next run). Returns (files added, files kept)."""
    root, out = Path(root).resolve(), Path(out).resolve()
    _outside(out, root)
    added = kept = 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp)
        _write_tree(root, fresh, WORKSPACE, student_repository(root))
        for path in sorted(p for p in fresh.rglob("*") if p.is_file()):
            target = out / path.relative_to(fresh)
            if target.exists() or target.is_symlink():
                kept += 1
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
            added += 1
    # Lessons 03 and 04 read a GPU node's saved runs from ../results (`make gpu-check`).
    results = out / "results"
    if (root / "results").is_dir() and not (results.exists() or results.is_symlink()):
        os.symlink(os.path.relpath(root / "results", out), results)
    return added, kept


def marker_lines(folder: Path) -> list[str]:
    """Every solution marker line in `folder`'s text files, as "path:line" (a notebook's cell
    lines included): a student edition must hold none, the regions' markers gone with them."""
    found = []
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue  # a binary file
        if path.suffix == ".ipynb":  # a cell's line is a JSON string: "    ### END SOLUTION\n",
            text = text.replace("\\n", "\n")
        for i, line in enumerate(text.splitlines(), 1):
            bare = line.strip().strip('",').strip()
            if bare in (BEGIN, END) or bare.startswith((HINT, STUB)):
                found.append(f"{path.relative_to(folder)}:{i}")
    return found


__all__ = ["COURSE", "LEFT_OUT", "WORKSPACE", "Written", "binder_url", "marker_lines",
           "release_course", "release_workspace", "student_repository"]
