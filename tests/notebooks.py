"""Running a notebook top to bottom from a test, with waits sized for a loaded 2-core machine.

nbclient's defaults give a kernel 60 s to start and a cell's last outputs 4 s to arrive after
its reply, and then drop those outputs with only a logged warning, so a test that looks for a
figure can fail on a busy laptop with nothing wrong. Here: 240 s to start (as pyproject.toml's
``--nbval-kernel-startup-timeout``), 60 s for outputs, and a late output is an error that says
so, never a silent loss.
"""

from __future__ import annotations

from pathlib import Path

WAITS = {"startup_timeout": 240, "iopub_timeout": 60, "raise_on_iopub_timeout": True}


def execute(nb, folder: Path, *, timeout: int, kernel_name: str | None = None) -> None:
    """Run `nb` (an nbformat notebook, filled with outputs in place) with `folder` as its
    working folder; `timeout` seconds per cell; on the kernel the notebook names unless
    `kernel_name` is given."""
    import nbclient

    extra = {"kernel_name": kernel_name} if kernel_name else {}
    nbclient.NotebookClient(nb, timeout=timeout, resources={"metadata": {"path": str(folder)}},
                            **WAITS, **extra).execute()
