"""`ruff check` over the whole repository (modules, tests, labs, benchmarks, notebooks' code
cells) with the rules in pyproject.toml ([tool.ruff]) passes: `make test` fails on a finding."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    run = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert "No module named ruff" not in run.stderr, (
        "ruff is missing from this environment: `make setup` installs the test extras "
        "(pip install -e '.[test]')")
    assert run.returncode == 0, f"ruff check found problems:\n{run.stdout}{run.stderr}"
