"""The lesson map's measured figures are the saved measurements' (benchmarks/lesson_map.py writes
them from benchmarks/results/lessons.json), and the words about the machine are computed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import lesson_map  # noqa: E402  (benchmarks/lesson_map.py)

from toolkit.hub import lesson_resources  # noqa: E402

MEASURED = json.loads(lesson_map.MEASURED.read_text())["lessons"]


def test_the_map_is_written_from_the_saved_measurements():
    text = lesson_map.MAP.read_text()
    assert lesson_map.render(text, MEASURED) == text, \
        "lessons/README.md is not up to date: python benchmarks/lesson_map.py"
    rows = {r.notebook: r for r in lesson_resources(text)}
    for name, entry in MEASURED.items():
        assert (ROOT / "lessons" / name).is_file(), f"{name} is measured but not a lesson"
        assert (rows[name].run_s, rows[name].peak_mb) == (entry["wall_s"], entry["peak_mib"])


ENTRY = {"wall_s": 10.0, "peak_mib": 400, "cpus": 2, "load_before": 0.5, "load_after": 0.7,
         "date": "2026-01-02", "commit": "abc"}
MAP = """| # | notebook | prerequisites | reading time | run time / peak memory | then |
|---|---|---|---|---|---|
| 00 | [`00_a.ipynb`](00_a.ipynb): a | - | 30 min | 99 s / 1 MB (busy) | lesson 01 |
| 01 | [`01_b.ipynb`](01_b.ipynb): b | 00 | 30 min | 1 s / 1 MB | — |

<!-- measured -->
typed by hand
<!-- /measured -->

After.
"""


def test_cells_and_words_come_from_the_entries():
    busy = {**ENTRY, "wall_s": 50.0, "peak_mib": 600, "load_before": 7.5, "date": "2026-01-03"}
    out = lesson_map.render(MAP, {"00_a.ipynb": ENTRY, "01_b.ipynb": busy})
    assert "| 10.0 s / 400 MiB |" in out and "| 50.0 s / 600 MiB † |" in out
    assert "typed by hand" not in out and out.endswith("<!-- /measured -->\n\nAfter.\n")
    words = out.split("<!-- measured -->")[1]
    assert "on 2 CPU cores, 2026-01-02 to 2026-01-03" in words
    assert "the slowest took 50.0 s (`01_b.ipynb`), the median 30.0 s" in words
    assert "600 MiB" in words and "1 of the 2 lessons" in words and "0.5-7.5" in words
    quiet = lesson_map.render(MAP, {"00_a.ipynb": ENTRY})
    assert "not measured yet" in quiet and "†" not in quiet


def test_a_map_without_its_paragraph_or_column_is_refused():
    with pytest.raises(ValueError, match="measured"):
        lesson_map.render(MAP.replace("<!-- /measured -->", ""), {})
    with pytest.raises(ValueError, match="column"):
        lesson_map.render(MAP.replace("run time / peak memory", "time"), {})
