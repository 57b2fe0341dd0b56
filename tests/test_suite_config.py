"""The suite's own configuration (root conftest.py): every lesson is executed once per session,
in the browser test when it runs, under nbval otherwise; under pytest-xdist (`make test`) a
notebook's cells, and the files sharing a costly fixture, run whole on one worker."""

from __future__ import annotations

import importlib.util
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


def _root_conftest():
    spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_notebooks_and_shared_fixture_files_are_one_unit_of_work_the_rest_single_tests():
    root = _root_conftest()
    scope = root.one_worker_scope
    assert scope("lessons/10_pipeline.ipynb::Cell 3") == "lessons/10_pipeline.ipynb"
    assert scope("tests/test_browser.py::test_lesson_runs_and_draws_in_a_browser[03_ring_cost]") \
        == "tests/test_browser.py"
    assert scope("tests/test_slurm.py::test_x") == scope("tests/test_slurm.py::test_y")
    assert scope("tests/test_cost.py::test_a[2]") == "tests/test_cost.py::test_a[2]"
    for path in root.ONE_WORKER_FILES:
        assert (ROOT / path).is_file(), path


def test_a_notebook_under_nbval_passes_in_two_workers():
    """Its cells run in order in one kernel: spread over two workers they failed (NameErrors)."""
    out = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "-q", "-p", "no:cacheprovider",
                          "lessons/10_pipeline.ipynb"], cwd=ROOT, capture_output=True, text=True,
                         timeout=280)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert " passed" in out.stdout and "failed" not in out.stdout
