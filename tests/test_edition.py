"""The student edition (`autograder release --course`) and `make lab`'s workspace hold no answer:
no reference body, no hidden check, no solution marker, no instructors' section; their links
resolve inside them; and the grade commands a student is told to type work from inside them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from autograder.edition import (LEFT_OUT, _readme, binder_url, marker_lines, release_course,
                                release_workspace, student_repository)
from autograder.release import BEGIN, END, solution_lines
from notebooks import execute

ROOT = Path(__file__).resolve().parents[1]
LABS = sorted(p.parent.name for p in (ROOT / "labs").glob("*/checks.py"))


@pytest.fixture(scope="module")
def edition(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("edition") / "course"
    done = release_course(out)
    assert done.files > 100 and done.regions >= len(LABS)
    return out


def _texts(folder: Path) -> dict[Path, str]:
    texts = {}
    for path in folder.rglob("*"):
        if path.is_file():
            try:
                texts[path] = path.read_text()
            except UnicodeDecodeError:
                pass
    return texts


def _code(text: str) -> list[str]:
    """Lines of code, stripped, without blank lines and comments (a notebook's JSON unfolded)."""
    text = text.replace("\\n", "\n")
    lines = (line.strip().strip('",').strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def regions() -> list[tuple[str, list[str]]]:
    """Every solution region of the instructor's labs and lessons: (where, its code lines)."""
    found = []
    for path in [*(ROOT / "labs").rglob("*.py"), *(ROOT / "labs").rglob("*.ipynb"),
                 *(ROOT / "lessons").glob("*.ipynb")]:
        if "hidden" in path.parts:
            continue
        text = path.read_text().replace("\\n", "\n")
        for body in re.findall(rf"{re.escape(BEGIN)}[^\n]*\n(.*?){re.escape(END)}", text, re.S):
            found.append((str(path.relative_to(ROOT)), _code(body)))
    return found


def test_no_reference_body_is_anywhere_in_it(edition):
    """No region's code, taken whole, in its file's edition (a lesson's one-line answer
    included), nor, when it is two lines or more, in any file of the edition (the toolkit
    included). Single lines of a region may be elsewhere (`for p in params:` is everywhere),
    but none is in its own lab's folder of the edition."""
    texts = {path: "\n".join(_code(text)) for path, text in _texts(edition).items()}
    everything = regions()
    assert len(everything) >= len(LABS)
    kept = [where for where, body in everything if "\n".join(body) in texts[edition / where]]
    assert kept == []
    bodies = [(where, body) for where, body in everything if len(body) >= 2]
    leaked = [(where, str(path.relative_to(edition))) for where, body in bodies
              for path, text in texts.items() if "\n".join(body) in text]
    assert leaked == []
    for lab in LABS:
        released = "".join(_texts(edition / "labs" / lab).values())
        lines = solution_lines(ROOT / "labs" / lab)
        assert lines and [line for line in lines if line in released] == [], lab


def test_no_hidden_check_no_marker_no_instructors_section(edition):
    assert not [p for p in edition.rglob("hidden") if p.is_dir()]
    assert marker_lines(edition) == []
    assert all(not (edition / path).exists() for path in LEFT_OUT)
    for lab in LABS:
        listed = json.loads((edition / "labs" / lab / "hidden_checks.json").read_text())
        assert listed["checks"] and all(set(c) == {"name", "points"} for c in listed["checks"])
    for path, text in _texts(edition).items():
        if path.suffix == ".md":
            assert not re.search(r"^## For instructors", text, re.M), path
    told = [str(p.relative_to(edition)) for p, text in _texts(edition).items()
            if re.search(r"autograder grade labs/\w", text)]
    assert told == [], "a command that fails from the lab's folder: say `autograder grade .`"
    makefile = (edition / "Makefile").read_text()
    assert "\ntest:" not in makefile and "INSTRUCTORS ONLY" not in makefile
    assert "\nlab:" in makefile and "\nsetup:" in makefile


def test_every_relative_link_in_it_resolves_inside_it(edition):
    broken = []
    for path in edition.rglob("*.md"):
        text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
        for target in re.findall(r"\]\(\s*<?([^)\s>]+)>?\s*\)", text):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue
            if not (path.parent / target.split("#")[0]).exists():
                broken.append(f"{path.relative_to(edition)} -> {target}")
    assert broken == []


def test_the_binder_badge_is_the_configured_repository_or_none(edition, tmp_path):
    readme = (edition / "README.md").read_text()
    repo = student_repository()
    assert "binder badge" not in readme
    assert (binder_url(repo) in readme) if repo else ("mybinder.org" not in readme)
    source = (ROOT / "README.md").read_text()
    assert f"[![Launch on Binder](https://mybinder.org/badge_logo.svg)]({binder_url('o/c')})" \
        in _readme(source, "o/c")
    (tmp_path / "pyproject.toml").write_text('[tool.course]\nstudent-repository = "o/c"\n')
    assert student_repository(tmp_path) == "o/c"
    (tmp_path / "pyproject.toml").write_text('[tool.course]\nstudent-repository = "o c"\n')
    with pytest.raises(ValueError, match="OWNER/NAME"):
        student_repository(tmp_path)


def _run(cmd: list[str], cwd: Path, edition: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(edition)}  # the edition's own grader and toolkit
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.multirank
def test_its_grade_commands_work_from_inside_it(edition):
    where = _run([sys.executable, "-c", "import autograder, toolkit; "
                  "print(autograder.__file__); print(toolkit.__file__)"], edition, edition)
    assert all(line.startswith(str(edition)) for line in where.stdout.split()), where.stdout
    listed = _run([sys.executable, "-m", "autograder", "labs"], edition, edition)
    assert listed.returncode == 0 and listed.stdout.count("(0 hidden)") == len(LABS)
    lab = edition / "labs" / "01_collectives"
    graded = _run([sys.executable, "-m", "autograder", "grade", "."], lab, edition)
    assert graded.returncode == 0, graded.stderr
    assert "0 / 40 points" in graded.stdout and "not_implemented" in graded.stdout
    assert f"Graded collectives.py: {lab / 'collectives.py'}" in graded.stdout
    assert "Hidden checks, which your instructor's grader runs" in graded.stdout


HELP_EVERY_SCRIPT = """
import runpy, sys
from pathlib import Path
for path in sorted(Path("benchmarks").glob("*.py")) + sorted(Path("scripts").glob("*.py")):
    main = '__name__ == "__main__"' in path.read_text()
    sys.argv = [str(path), "--help"]
    sys.path.insert(0, str(path.parent.resolve()))   # as `python path` puts its folder first
    try:
        runpy.run_path(str(path), run_name="__main__" if main else path.stem)
    except SystemExit as done:
        if done.code not in (0, None):
            raise SystemExit(f"{path} --help: exit {done.code}")
    print("ok", path)
"""


def test_every_script_it_holds_or_its_makefile_names_runs_inside_it(edition):
    """A student's `make bench` and every benchmark a lesson points to work in the edition: the
    scripts its Makefile names are there, and each script there answers --help (its imports
    resolve inside the edition: nothing reaches for the tests or the hidden checks)."""
    named = set(re.findall(r"\b((?:benchmarks|scripts)/[\w./-]+\.py)\b",
                           (edition / "Makefile").read_text()))
    assert "benchmarks/launch_overhead.py" in named
    assert not {p for p in named if not (edition / p).is_file()}
    assert not any(p.startswith(("benchmarks/grading", "benchmarks/cluster_paths"))
                   for p in named)                    # the instructor's part of `make bench`
    ran = _run([sys.executable, "-c", HELP_EVERY_SCRIPT], edition, edition)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout.count("ok ") == len([*(edition / "benchmarks").glob("*.py"),
                                           *(edition / "scripts").glob("*.py")])
    # `make bench` ends by writing the pages and the lesson map: in the edition they are already
    # what those scripts write (an instructors' section's region left out is skipped, saying so).
    for script in ("benchmarks/figures_page.py", "benchmarks/lesson_map.py"):
        check = _run([sys.executable, script, "--check"], edition, edition)
        assert check.returncode == 0, (script, check.stdout, check.stderr[-2000:])


def test_the_workspace_never_overwrites_a_students_work(tmp_path):
    work = tmp_path / "workspace"
    added, kept = release_workspace(work)
    assert added > 0 and kept == 0
    assert {p.name for p in work.iterdir()} >= {"lessons", "labs"}
    assert marker_lines(work) == [] and not list(work.rglob("hidden"))
    mine = work / "labs" / "01_collectives" / "collectives.py"
    mine.write_text("# my work\n")
    (work / "lessons" / "README.md").unlink()
    again = release_workspace(work)
    assert again == (1, added - 1)
    assert mine.read_text() == "# my work\n" and (work / "lessons" / "README.md").is_file()


STUBBED = sorted(p.name for p in (ROOT / "lessons").glob("*.ipynb") if BEGIN in p.read_text())


@pytest.mark.slow
@pytest.mark.multirank
@pytest.mark.parametrize("name", STUBBED)
def test_a_lessons_student_edition_runs_with_its_stubs(edition, name):
    """What a student opens (and the website executes): every exercise still the stub, the
    lesson runs top to bottom and each check says what to fill in."""
    pytest.importorskip("nbclient")
    import nbformat

    nb = nbformat.read(edition / "lessons" / name, as_version=4)
    execute(nb, edition / "lessons", timeout=300, kernel_name="python3")
    said = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    asked = re.findall(r"Exercise \d+: fill in", said)
    assert asked and not re.search(r"Exercise \d+: correct", said), said[-2000:]
