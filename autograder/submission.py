"""Which files of a submission are graded, and whether they are Python at all.

A lab names its student files (``LAB.student_files``, e.g. ``("collectives.py",)``). A
submission is a file or a folder; the grader looks for each file only where a lab's file can
be, never anywhere below (a recursive search of ``/tmp`` once graded another user's file):

    FOLDER/collectives.py                   a submission folder, or the lab folder itself
    FOLDER/01_collectives/collectives.py    a folder holding the lab folder
    FOLDER/labs/01_collectives/collectives.py   the course's top folder (or the workspace)

Several of those present is refused (which one did the student mean?); none is a missing file,
and the message says where it looked. A single file is taken as the lab's file when it has the
file's name, or (for a one-file lab) any ``.py`` name (a batch folder of ``alice.py``, ...);
anything else (``README.md``, a notebook) is refused naming the file to grade instead.

Nothing is followed: a symbolic link anywhere from the submission folder down to a file (the
file itself, ``labs/``, the lab folder) is refused, and each file is read with ``O_NOFOLLOW``
and ``O_NONBLOCK``, only if it is a regular file, and at most `MAX_SOURCE_BYTES` of it
(`read_sources`). The grader runs as root: a submitted link to the reference solution scored
100, one to /etc/shadow was quoted in the report, one to /proc/kmsg blocked the grader past its
timeout (red team 8).

Each refusal is one `Problem` (a failure kind of `autograder.failures.KINDS` and one message),
which the grade reports once, above its checks, instead of under every check.
"""

from __future__ import annotations

import ast
import os
import stat
from dataclasses import dataclass
from pathlib import Path

MAX_SOURCE_BYTES = 4 << 20
"""A student file larger than this (4 MiB; the labs' reference files are under 40 KiB) is
refused before it is read in full."""


@dataclass(frozen=True)
class Problem:
    """Why no check of a grade ran: a failure kind and the one message that says why."""

    kind: str
    message: str


def _places(folder: Path, name: str, slugs: tuple[str, ...]) -> list[Path]:
    places = [folder / name]
    for slug in dict.fromkeys(slugs):
        places += [folder / slug / name, folder / "labs" / slug / name]
    return places


def locate(student_files: tuple[str, ...], slugs: tuple[str, ...], submission: Path
           ) -> tuple[dict[str, Path], Problem | None]:
    """{lab file name: the path graded for it}, or the problem that stops the grade.

    `slugs`: the lab's names for its folder (``LAB.slug`` and the lab folder's name)."""
    submission = Path(submission)
    wanted = list(student_files)
    if submission.is_symlink():  # a batch folder's entry may not lead to another's files
        return {}, _link_problem(submission)
    if submission.is_file():
        name = submission.name
        if name in wanted or (len(wanted) == 1 and submission.suffix == ".py"):
            return {name if name in wanted else wanted[0]: submission}, None
        return {}, Problem("missing_file", f"{submission} is not {_either(wanted)}: grade the "
                           f"file you edited ({_either(wanted)}) or its lab folder.")
    if not submission.is_dir():
        return {}, Problem("missing_file", f"{submission} does not exist.")
    found: dict[str, Path] = {}
    for name in wanted:
        linked = [p for p in _places(submission, name, slugs) if _linked_below(submission, p)]
        if linked:
            return {}, _link_problem(linked[0])
        hits = list(dict.fromkeys(p.resolve() for p in _places(submission, name, slugs)
                                  if p.is_file()))
        if len(hits) > 1:
            return {}, Problem("ambiguous_file", f"Several files could be the lab's {name}: "
                               f"{', '.join(map(str, hits))}. Grade one of them (give its path) "
                               "or remove the others.")
        if hits:
            found[name] = hits[0]
    missing = [n for n in wanted if n not in found]
    if missing:
        looked = ", ".join(str(p) for p in _places(submission, missing[0], slugs))
        elsewhere = sorted(str(p) for p in submission.glob(f"*/{missing[0]}"))
        hint = f" Found {', '.join(elsewhere)}: grade that file or its folder." if elsewhere else ""
        return {}, Problem("missing_file", f"The submission has no {', '.join(missing)} "
                           f"(looked for {looked}).{hint}")
    return found, None


def _linked_below(root: Path, path: Path) -> bool:
    """Whether a component of `path` below `root` (the file included) is a symbolic link."""
    here = root
    for part in path.relative_to(root).parts:
        here = here / part
        if here.is_symlink():
            return True
        if not here.exists():
            return False
    return False


def _link_problem(path: Path) -> Problem:
    return Problem("missing_file", f"{path} is a symbolic link (or lies below one): the grader "
                   "follows no links. Submit the file itself.")


def read_sources(paths: dict[str, Path]) -> tuple[dict[str, bytes], Problem | None]:
    """Each located file's bytes, read without following a link or blocking: only regular
    files, at most `MAX_SOURCE_BYTES` each; else the problem that stops the grade."""
    out: dict[str, bytes] = {}
    for name, path in paths.items():
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as err:
            return {}, Problem("missing_file", f"{path} cannot be read ({err.strerror}): "
                               "submit the file itself.")
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                return {}, Problem("missing_file", f"{path} is not a regular file: submit the "
                                   f".py file you edited.")
            if info.st_size > MAX_SOURCE_BYTES:
                return {}, Problem("missing_file", f"{path} is {info.st_size:,} bytes, over "
                                   f"the {MAX_SOURCE_BYTES >> 20} MiB a lab file may have.")
            with os.fdopen(os.dup(fd), "rb") as f:
                data = f.read(MAX_SOURCE_BYTES + 1)
        finally:
            os.close(fd)
        if data is None:  # a "regular" file that would block (procfs's kmsg): nothing to read
            return {}, Problem("missing_file", f"{path} has nothing to read without waiting: "
                               "submit the .py file you edited.")
        if len(data) > MAX_SOURCE_BYTES:
            return {}, Problem("missing_file", f"{path} grew past {MAX_SOURCE_BYTES >> 20} MiB "
                               "while it was read.")
        out[name] = data
    return out, None


def _either(names: list[str]) -> str:
    return names[0] if len(names) == 1 else "one of " + ", ".join(names)


def parse_problem(files: dict[str, bytes]) -> Problem | None:
    """A file that is not Python (binary, not UTF-8) or does not parse: one message naming it
    and, for a syntax error, its line. `compile` runs nothing."""
    for name, source in files.items():
        if b"\0" in source:
            return Problem("syntax_error", f"{name} is not Python source (it holds null "
                           "bytes: a binary file?). Submit the .py file you edited.")
        try:
            tree = ast.parse(source, filename=name)
            compile(tree, name, "exec")
        except SyntaxError as err:
            where = f"{name} line {err.lineno}" if err.lineno else name
            code = f"\n    {err.text.rstrip()}" if err.text and err.text.strip() else ""
            return Problem("syntax_error", f"Syntax error in {where}: {err.msg}{code}")
        except (ValueError, UnicodeDecodeError) as err:
            return Problem("syntax_error", f"{name} is not Python source ({err}). Submit the "
                           ".py file you edited.")
    return None


__all__ = ["MAX_SOURCE_BYTES", "Problem", "locate", "parse_problem", "read_sources"]
