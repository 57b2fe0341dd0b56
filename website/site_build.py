"""The course as a static website: lessons executed once, parsed by Jupyter Book 2 / MyST, drawn.

The site is the student edition (`autograder release --course`, written to OUT/edition first):
lessons with their exercises stubbed, labs without solutions or "For instructors" sections,
docs without theirs. Its Binder links name pyproject.toml's ``[tool.course]
student-repository``; unset, the site has none and the build says so.

Steps (each a function below, `main` runs them in order):
1. pages: the lesson map (lessons/README.md) is the landing page and gives the lessons' order;
   every lessons/*.ipynb the map does not list yet is appended (glob), so a new lesson is never
   left out. Then labs/README.md and labs/*/README.md, then docs/*.md.
2. execute: each lesson runs top to bottom in a fresh kernel (nbclient), `--jobs` at a time,
   in lessons/ as its working folder; the executed copy (outputs and widget state) goes to the
   staging folder, never back into lessons/. A cell that raises fails the build, naming the
   lesson and the cell. `--execute` names a subset (the test suite runs one lesson); the other
   lessons are then shown as stored, without outputs, and the page says so.
3. myst: `jupyter-book build --site` parses every page into MyST's AST (links between pages
   resolved, notebooks copied as downloads). MyST's own HTML themes are downloaded from the
   internet at build time, so the site template here is a local, empty one: MyST's `--site`
   output (content/*.json) is drawn by website/site_render.py instead, which needs no network.
4. render: one HTML page per MyST page, plotly figures interactive (plotly.js from the plotly
   package), widgets as their saved state, a "run it live" link per lesson.

Usage: python website/site_build.py [--out build/site] [--execute all|none|NAME,...] [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(ROOT / "benchmarks"))   # lesson_resources: one way to run a lesson
import site_render as render  # noqa: E402  (website/site_render.py, beside this file)

from autograder.edition import release_course, student_repository  # noqa: E402

TITLE = "Distributed deep-learning training, hands on"
CELL_TIMEOUT_S = 300      # one cell; a lesson runs in well under a minute, a busy machine slower
MAP_LINK = re.compile(r"\]\(\s*<?(?:\./)?([0-9][^)\s>]*\.ipynb)>?\s*\)")


@dataclass(frozen=True)
class Pages:
    """Repository-relative paths of the site's pages, in reading order."""
    landing: str
    lessons: list[str]
    labs: list[str]
    docs: list[str]


def course_pages(root: Path = ROOT) -> Pages:
    """The lesson map's order first, then lessons it does not list yet (by name), labs, docs."""
    lesson_map = root / "lessons" / "README.md"
    if not lesson_map.exists():
        raise FileNotFoundError(f"{lesson_map} is missing: the site's landing page is the map")
    on_disk = {p.name for p in (root / "lessons").glob("*.ipynb")}
    ordered: list[str] = []
    for name in MAP_LINK.findall(lesson_map.read_text()):
        if name in on_disk and name not in ordered:
            ordered.append(name)
    ordered += sorted(on_disk - set(ordered))
    labs = [p.relative_to(root).as_posix() for p in sorted((root / "labs").glob("*/README.md"))]
    if (root / "labs" / "README.md").exists():
        labs.insert(0, "labs/README.md")
    docs = [p.relative_to(root).as_posix() for p in sorted((root / "docs").glob("*.md"))]
    return Pages("lessons/README.md", [f"lessons/{n}" for n in ordered], labs, docs)


def execute_lesson(src: str, dst: str) -> tuple[float, int]:
    """Run one notebook top to bottom in a fresh kernel (benchmarks/lesson_resources.py, which
    also measures the lesson's peak memory); write it with outputs to dst. (seconds, bytes)."""
    from lesson_resources import run

    return run(Path(src), save_to=Path(dst))  # raises CellExecutionError if a cell fails


def execute_lessons(lessons: list[str], staging: Path, *, jobs: int, root: Path | None = None
                    ) -> dict[str, tuple[float, int]]:
    """Execute lessons (paths relative to `root`, default this repository) `jobs` at a time; a
    failure stops the build with the lesson's name."""
    if jobs < 1:
        raise ValueError(f"jobs={jobs}: expected at least 1 notebook at a time")
    root = ROOT if root is None else root
    measured: dict[str, tuple[float, int]] = {}
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = {rel: pool.submit(execute_lesson, str(root / rel), str(staging / rel))
                   for rel in lessons}
        for rel, future in futures.items():
            try:
                measured[rel] = future.result()
            except Exception as err:
                for other in futures.values():
                    other.cancel()
                raise SystemExit(f"site build failed: {rel} did not run to the end:\n"
                                 f"{err}") from err
            wall, peak = measured[rel]
            print(f"executed {rel} in {wall:.1f} s, peak {peak / 2**20:.0f} MB (PSS)", flush=True)
    return measured


def selected(lessons: list[str], execute: str) -> list[str]:
    """`all`, `none` or comma-separated lesson names (with or without .ipynb)."""
    if execute == "all":
        return lessons
    if execute == "none":
        return []
    wanted = {n.strip().removesuffix(".ipynb") for n in execute.split(",") if n.strip()}
    known = {Path(rel).stem: rel for rel in lessons}
    unknown = sorted(wanted - set(known))
    if unknown:
        raise SystemExit(f"--execute names {unknown}: not lessons; expected all, none or some "
                         f"of {sorted(known)}")
    return [known[n] for n in sorted(wanted)]


def toc(pages: Pages) -> list[dict]:
    return [{"file": pages.landing},
            {"title": "Lessons", "children": [{"file": f} for f in pages.lessons]},
            {"title": "Labs", "children": [{"file": f} for f in pages.labs]},
            {"title": "Notes", "children": [{"file": f} for f in pages.docs]}]


def stage(pages: Pages, staging: Path, root: Path = ROOT) -> None:
    """Copy every page of `root` (the student edition) and the lab folders' files, which the
    READMEs link, into staging/."""
    if staging.exists():
        shutil.rmtree(staging)
    for rel in [pages.landing, *pages.lessons, *pages.docs]:
        (staging / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(root / rel, staging / rel)
    for rel in pages.labs:  # a lab README links its playground and the file students edit
        src = (root / rel).parent
        shutil.copytree(src, staging / src.relative_to(root), dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("hidden", "__pycache__", ".ipynb_*"))
    # MyST needs a site template; its own are downloaded at build time. This local one is empty:
    # `--site` only writes MyST's AST, which site_render.py draws.
    template = staging / "_template"
    template.mkdir()
    (template / "template.yml").write_text("myst: v1\nkind: site\ntitle: course (site_render.py)\n")
    (template / "package-lock.json").write_text("{}\n")
    config = {"version": 1,
              "project": {"title": TITLE, "toc": toc(pages)},
              "site": {"template": "./_template"}}
    (staging / "myst.yml").write_text(json.dumps(config, indent=2))  # JSON is valid YAML


def run_myst(staging: Path) -> Path:
    """`jupyter-book build --site` in staging; returns MyST's site folder (config, content)."""
    exe = Path(sys.executable).with_name("jupyter-book")
    cmd = [str(exe) if exe.exists() else "jupyter-book", "build", "--site"]
    done = subprocess.run(cmd, cwd=staging, capture_output=True, text=True, timeout=600)
    out = staging / "_build" / "site"
    if done.returncode != 0 or not (out / "config.json").exists():
        raise SystemExit(f"site build failed: {' '.join(cmd)} exited {done.returncode}:\n"
                         f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "site")
    parser.add_argument("--execute", default="all", help="all, none, or lesson names: 00,08_fsdp")
    parser.add_argument("--jobs", type=int, default=2, help="lessons executed at a time")
    parser.add_argument("--repo", default=None, help="GitHub OWNER/NAME of the student "
                        "edition for Binder links (default: pyproject.toml's [tool.course] "
                        "student-repository)")
    args = parser.parse_args(argv)
    start = time.monotonic()
    repo = args.repo or student_repository()
    if repo is None:
        print("site: no Binder links (set student-repository = \"OWNER/NAME\" under "
              "[tool.course] in pyproject.toml, or pass --repo)", flush=True)
    edition = args.out / "edition"
    release_course(edition, force=True)
    pages = course_pages(edition)
    staging = args.out / "src"
    stage(pages, staging, edition)
    to_run = selected(pages.lessons, args.execute)
    execute_lessons(to_run, staging, jobs=args.jobs, root=edition)
    myst_site = run_myst(staging)
    html = args.out / "html"
    n = render.render_site(myst_site, staging, html, executed=set(to_run), repo=repo)
    size = sum(p.stat().st_size for p in html.rglob("*") if p.is_file())
    print(f"site: {n} pages, {size / 2**20:.1f} MiB in {html} "
          f"({len(to_run)} of {len(pages.lessons)} lessons executed) "
          f"in {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
