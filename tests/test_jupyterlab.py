"""`make lab` serves the course: the student edition's lessons and labs copied into a workspace,
JupyterLab rooted there printing a URL that opens the lesson map, the plotly and widget
extensions the lessons draw with, and `autograder` on the PATH of its terminals. JupyterLab is
started with the very commands `make -n lab` prints. (Rendering in a real browser is the
browser test's job.)"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LESSONS = ROOT / "lessons"


def get(url: str, method: str = "GET"):
    with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=10) as r:
        return json.loads(r.read())


def make_lab(workspace: Path) -> tuple[str, str]:
    """The two commands `make lab` runs (the workspace release, JupyterLab), as make prints
    them, with a free port and a known token."""
    out = subprocess.run(["make", "-n", "lab", f"WORKSPACE={workspace}",
                          "LAB_ARGS=--port=0 --IdentityProvider.token=t"], cwd=ROOT, text=True,
                         capture_output=True, timeout=60, check=True).stdout.splitlines()
    (release,) = [line for line in out if "autograder release --workspace" in line]
    (lab,) = [line for line in out if " lab " in line and "jupyter" in line]
    return release, lab


def terminal_says(base: str, command: str, marker: str, timeout: float = 30.0) -> str:
    """Open a JupyterLab terminal, type `command`, return its output up to `marker`."""
    import websocket  # websocket-client, a dependency of jupyter_server

    name = get(f"{base}/api/terminals?token=t", method="POST")["name"]
    ws = websocket.create_connection(
        f"{base.replace('http', 'ws', 1)}/terminals/websocket/{name}?token=t", timeout=timeout)
    try:
        ws.send(json.dumps(["stdin", f"{command}; echo {marker}-done\r"]))
        seen, deadline = "", time.monotonic() + timeout
        while f"{marker}-done" not in seen.replace(f"echo {marker}-done", "") \
                and time.monotonic() < deadline:
            message = json.loads(ws.recv())
            if message[0] == "stdout":
                seen += message[1]
        return seen
    finally:
        ws.close()


@pytest.mark.slow
def test_make_lab_serves_the_workspace_with_plotly_widgets_and_the_grader(tmp_path):
    workspace = tmp_path / "workspace"
    release, lab = make_lab(workspace)
    subprocess.run(["bash", "-c", release], cwd=ROOT, check=True, timeout=120,
                   capture_output=True)
    assert {p.name for p in workspace.iterdir()} >= {"lessons", "labs"}
    log = tmp_path / "lab.log"
    # The user's PATH without the venv, and a shell whose login profile would reset it.
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                           if not p.startswith(str(ROOT)))
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), PATH=path,
               SHELL="/bin/bash")
    with open(log, "w") as out:
        server = subprocess.Popen(["bash", "-c", lab], cwd=ROOT, stdout=out,
                                  stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        port = None
        deadline = time.monotonic() + 240  # a server or kernel start on a loaded laptop
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
        said = terminal_says(base, "command -v autograder", "grader")
        assert str(ROOT / ".venv" / "bin" / "autograder") in said, said
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
