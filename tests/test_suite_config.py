"""The suite's own configuration (root conftest.py): every lesson is executed once per session,
in the browser test when it runs, under nbval otherwise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LESSON = "lessons/00_getting_started.ipynb"


def _collected(*args: str) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                          "-p", "no:cacheprovider", *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return [line for line in out.stdout.splitlines() if "::" in line]


def test_a_lesson_is_run_by_nbval_when_the_browser_test_does_not_run_it():
    ids = _collected(LESSON, "tests/test_browser.py", "-m", "not browser")
    assert ids and all(i.startswith(LESSON + "::Cell") for i in ids), ids


def test_a_lesson_the_browser_test_runs_is_not_run_again_by_nbval():
    if not Path("/usr/bin/chromium").exists():
        pytest.skip("no Chromium: the browser test is not collected, nbval runs every lesson")
    pytest.importorskip("playwright.sync_api")
    ids = _collected(LESSON, "tests/test_browser.py", "-k", "00_getting_started")
    assert ids == ["tests/test_browser.py::test_lesson_runs_and_draws_in_a_browser"
                   "[00_getting_started]"], ids
