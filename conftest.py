"""pytest settings for the whole repository (tests/conftest.py holds the tests' own fixtures).

nbval, which runs the lessons under `make test`, waits 5 s for a finished cell's output
messages and 60 s for a kernel to start. On a loaded laptop (`make test-busy`) both can run
out although nothing is wrong; they are waits, not measurements, so they are widened here (the
kernel's start in pyproject.toml's addopts, the output wait below).

Each lesson runs once per session. `tests/test_browser.py` runs a lesson top to bottom in
JupyterLab and fails on any error output or a cell that did not run, which is everything nbval
(`--nbval-lax`) checks, and then checks that its figures and widgets are drawn. Where the browser
test is collected for a lesson (Chromium and Playwright present, not deselected by `-m` or `-k`),
that lesson's nbval cells are deselected; everywhere else nbval runs the lesson. Running every
lesson twice cost the suite about a quarter of its time.
"""

from __future__ import annotations

from pathlib import Path

import pytest

NBVAL_OUTPUT_WAIT_S = 60
BROWSER_LESSON_TEST = "test_lesson_runs_and_draws_in_a_browser"

ONE_WORKER_FILES = ("tests/test_browser.py", "tests/test_site.py", "tests/test_slurm.py")
"""Test files run whole on one pytest-xdist worker: their tests share a costly module fixture
(JupyterLab and Chromium, a site build, a SLURM cluster) that would otherwise start on both."""


def one_worker_scope(nodeid: str) -> str:
    """The unit of work `make test`'s pytest-xdist workers take (`ONE_WORKER_FILES`): a whole
    file for those and for a notebook (nbval runs a notebook's cells in order in one kernel;
    spread over two workers each ran only some cells: NameErrors), else the single test."""
    path = nodeid.split("::", 1)[0]
    return path if path in ONE_WORKER_FILES or path.endswith(".ipynb") else nodeid


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook; `make test` runs with -n 2
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """xdist's LoadScope scheduling (largest units first) over `one_worker_scope`. Not
    `--dist loadgroup` with xdist_group marks: xdist 3.8 writes the group into `item._nodeid`,
    which pytest 9 no longer reads, so the marks group nothing there."""
    from xdist.scheduler import LoadScopeScheduling

    class OneWorkerScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return one_worker_scope(nodeid)

    return OneWorkerScheduling(config, log)


def _browser_lessons(items: list[pytest.Item]) -> set[str]:
    """Names of the lessons the browser test will run in this session."""
    names = set()
    for item in items:
        if getattr(item, "originalname", None) == BROWSER_LESSON_TEST:
            names.add(Path(item.callspec.params["lesson"]).name)
    return names


@pytest.hookimpl(trylast=True)  # after `-m`/`-k` deselection: only tests that will run count
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    in_browser = _browser_lessons(items)
    keep, dropped = [], []
    for item in items:
        if hasattr(item, "output_timeout"):  # nbval's notebook cells
            item.output_timeout = NBVAL_OUTPUT_WAIT_S
            if Path(str(item.fspath)).name in in_browser:
                dropped.append(item)
                continue
        keep.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
