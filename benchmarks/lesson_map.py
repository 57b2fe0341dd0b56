"""Write the lesson map's measured figures from the saved measurements, never by hand.

lessons/README.md shows each lesson's run time and peak memory, and a paragraph about the
machine they were taken on; both come from `lesson_resources.MEASURED`
(benchmarks/results/lessons.json, written by ``benchmarks/lesson_resources.py --save``):

* the "run time / peak memory" cell of each lesson's row: ``12.3 s / 456 MiB``, with † when the
  machine was busy (its 1-minute load average above its cores just before the run), or
  "not measured yet";
* the paragraph between ``<!-- measured -->`` and ``<!-- /measured -->``: where and when, the
  slowest and the median lesson, how busy the machine was.

tests/test_lesson_map.py fails when the map and the file disagree. After measuring:

    python benchmarks/lesson_resources.py --save [lessons/NN_x.ipynb ...]
    python benchmarks/lesson_map.py             # --check: exit 1 if the map is not up to date
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from lesson_resources import MEASURED  # noqa: E402  (benchmarks/lesson_resources.py)

MAP = ROOT / "lessons" / "README.md"
BEGIN, END = "<!-- measured -->", "<!-- /measured -->"
COLUMN = "run time / peak memory"
BUSY = "†"
NOTEBOOK = re.compile(r"\[`?([^`\]]+\.ipynb)`?\]")
"""A row's notebook: its link text, [NN_x.ipynb] (backticks around it are accepted too)."""


def busy(entry: dict) -> bool:
    """Whether the machine was busy: a load average above its cores just before the run."""
    return entry["load_before"] > entry["cpus"]


def cell(entry: dict | None) -> str:
    if entry is None:
        return "not measured yet"
    return f"{entry['wall_s']:.1f} s / {entry['peak_mib']:.0f} MiB" + (f" {BUSY}"
                                                                        if busy(entry) else "")


def paragraph(lessons: dict[str, dict]) -> str:
    """The measured machine, in words computed from the entries."""
    if not lessons:
        return "No lesson has been measured yet (`benchmarks/lesson_resources.py --save`)."
    entries = list(lessons.values())
    slowest = max(lessons, key=lambda name: lessons[name]["wall_s"])
    cpus = sorted({e["cpus"] for e in entries})
    dates = sorted({e["date"] for e in entries})
    loads = [e["load_before"] for e in entries]
    text = (f"Run time and peak memory (PSS of the kernel and its ranks) of each lesson run top "
            f"to bottom in a fresh kernel by `benchmarks/lesson_resources.py`, on "
            f"{' or '.join(map(str, cpus))} CPU cores, "
            f"{dates[0] if len(dates) == 1 else f'{dates[0]} to {dates[-1]}'}: the slowest "
            f"took {lessons[slowest]['wall_s']:.1f} s (`{slowest}`), the median "
            f"{statistics.median(e['wall_s'] for e in entries):.1f} s; the most memory was "
            f"{max(e['peak_mib'] for e in entries):.0f} MiB (Binder allows about 2 GB).")
    n_busy = sum(busy(e) for e in entries)
    if n_busy:
        text += (f" {BUSY} {n_busy} of the {len(entries)} lessons were measured while other "
                 f"work kept the machine busy (load average {min(loads):.1f}-{max(loads):.1f} "
                 "just before a run, above its cores): on an idle machine expect them faster.")
    return text


def render(text: str, lessons: dict[str, dict]) -> str:
    """The map `text` with every row's measured cell and the paragraph written from
    `lessons` ({notebook name: entry})."""
    lines = text.splitlines()
    header = next((i for i, line in enumerate(lines) if COLUMN in line), None)
    if header is None:
        raise ValueError(f"the lesson map has no '{COLUMN}' column")
    column = [c.strip() for c in lines[header].split("|")].index(COLUMN)
    for i, line in enumerate(lines):
        cells = line.split("|")
        if i > header + 1 and line.startswith("| ") and len(cells) > column + 1:
            linked = NOTEBOOK.search(cells[2])
            if linked:
                cells[column] = f" {cell(lessons.get(linked.group(1)))} "
                lines[i] = "|".join(cells)
    out = "\n".join(lines) + "\n"
    if BEGIN not in out or END not in out:
        raise ValueError(f"the lesson map has no {BEGIN} ... {END} paragraph to write")
    head, rest = out.split(BEGIN, 1)
    return f"{head}{BEGIN}\n{paragraph(lessons)}\n{END}{rest.split(END, 1)[1]}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the map is not up to date")
    args = ap.parse_args(argv)
    lessons = json.loads(MEASURED.read_text())["lessons"] if MEASURED.exists() else {}
    text = MAP.read_text()
    new = render(text, lessons)
    if args.check:
        if new != text:
            print(f"{MAP.relative_to(ROOT)} is not up to date with "
                  f"{MEASURED.relative_to(ROOT)}: run python benchmarks/lesson_map.py")
            return 1
        return 0
    MAP.write_text(new)
    print(f"wrote {MAP.relative_to(ROOT)} from {MEASURED.relative_to(ROOT)} "
          f"({len(lessons)} lessons measured)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
