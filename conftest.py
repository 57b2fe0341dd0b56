"""pytest settings for the whole repository (tests/conftest.py holds the tests' own fixtures).

nbval, which runs every lesson under `make test`, waits 5 s for a finished cell's output
messages and 60 s for a kernel to start. On a loaded laptop (`make test-busy`) both can run
out although nothing is wrong; they are waits, not measurements, so they are widened here (the
kernel's start in pyproject.toml's addopts, the output wait below).
"""

from __future__ import annotations

NBVAL_OUTPUT_WAIT_S = 60


def pytest_collection_modifyitems(items):
    for item in items:
        if hasattr(item, "output_timeout"):  # nbval's notebook cells
            item.output_timeout = NBVAL_OUTPUT_WAIT_S
