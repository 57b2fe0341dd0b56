"""A pytest plugin for benchmarks/cluster_paths.py: every test's setup, call and teardown
seconds and outcome, appended as JSON lines to the file named by $PYTEST_PHASES.

Loaded with ``-p pytest_phases`` (benchmarks/ on PYTHONPATH); without the variable it does
nothing. The setup of a module's first test includes its module fixtures (the SLURM cluster's
start), the teardown of its last their end.
"""

from __future__ import annotations

import json
import os


def pytest_runtest_logreport(report) -> None:
    path = os.environ.get("PYTEST_PHASES")
    if not path:
        return
    with open(path, "a") as f:
        f.write(json.dumps({"test": report.nodeid, "when": report.when,
                            "seconds": report.duration, "outcome": report.outcome}) + "\n")
