"""`make lab` serves the course: JupyterLab starts at the repository root (lessons and labs in
reach), prints a URL that opens the lesson map, and has the plotly and widget extensions the
lessons draw with. (Rendering in a real browser is the browser test's job.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LESSONS = ROOT / "lessons"
# `make lab`'s own options (the lesson map first), read from the Makefile.
LAB_MAP = re.search(r"^LAB_MAP\s*:=\s*(.+)$", (ROOT / "Makefile").read_text(),
                    re.M).group(1).split()


def get(url: str):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


@pytest.mark.slow
def test_jupyterlab_serves_the_lessons_with_plotly_and_widgets(tmp_path):
    jupyter = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1",
               "--port=0", "--IdentityProvider.token=t", *LAB_MAP]
    if os.geteuid() == 0:
        jupyter.append("--allow-root")
    log = tmp_path / "lab.log"
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"))
    with open(log, "w") as out:
        server = subprocess.Popen(jupyter, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                  env=env)
    try:
        port = None
        deadline = time.monotonic() + 60
        while port is None and time.monotonic() < deadline and server.poll() is None:
            m = re.search(r"http://127\.0\.0\.1:(\d+)(/\S*)", log.read_text())
            port, printed = (int(m.group(1)), m.group(2)) if m else (None, "")
            time.sleep(0.2)
        assert port, f"JupyterLab did not start:\n{log.read_text()[-3000:]}"
        base = f"http://127.0.0.1:{port}"
        assert printed.split("?")[0] == "/lab/tree/lessons/README.md", printed  # the map first
        top = {c["name"] for c in get(f"{base}/api/contents?token=t")["content"]}
        assert {"lessons", "labs"} <= top, top
        names = {c["name"] for c in get(f"{base}/api/contents/lessons?token=t")["content"]}
        assert {p.name for p in LESSONS.glob("*.ipynb")} <= names
        extensions = {e["name"] for e in get(f"{base}/lab/api/extensions?token=t")}
        assert "jupyterlab-plotly" in extensions, extensions
        assert any("widgets" in e and "manager" in e for e in extensions), extensions
    finally:
        server.terminate()
        server.wait(timeout=30)
