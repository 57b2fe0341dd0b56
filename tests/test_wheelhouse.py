"""A GPU node without internet (docs/cluster.md): `make wheelhouse` downloads, on a connected
machine, every dependency the GPU check needs but torch, for the node's Python and platform;
`make gpu-check GPU_PYTHON=...` installs from it with --no-index into the Python that holds the
node's CUDA torch, then the project (editable, --no-deps), and never installs torch. Checked as
the commands they would run (dry runs); `make wheelhouse` itself downloads (docs/cluster.md
shows what it saved with --save)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from autograder.sandbox.rank import load_module

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheelhouse():
    return load_module(ROOT / "benchmarks" / "wheelhouse.py", "wheelhouse")


def test_the_requirements_come_from_pyproject_and_exclude_torch(wheelhouse):
    reqs = wheelhouse.requirements()
    assert [wheelhouse._name(r) for r in reqs] == list(wheelhouse.NEEDED)
    assert "numpy>=1.26" in reqs and "nbclient>=0.10" in reqs  # pyproject's ranges
    assert not any(r.startswith("torch") for r in reqs)


def test_download_asks_pip_for_wheels_of_the_node_s_python_and_platform(wheelhouse, capsys):
    assert wheelhouse.main(["download", "--python", "3.12", "--platform", "aarch64",
                            "--dest", "/tmp/wh", "--dry-run"]) == 0
    cmd = capsys.readouterr().out.strip().splitlines()[-1]
    assert "-m pip download --dest /tmp/wh --only-binary=:all: --python-version 3.12" in cmd
    assert "--platform manylinux2014_aarch64" in cmd and "torch" not in cmd.split()
    assert wheelhouse.main(["download", "--python", "twelve", "--dry-run"]) == 2


def test_download_says_and_records_what_the_folder_holds(wheelhouse, capsys, monkeypatch,
                                                         tmp_path):
    def pip(cmds, dry_run):   # the wheels pip would have left in --dest
        dest = Path(cmds[0][cmds[0].index("--dest") + 1])
        dest.mkdir()
        for name, size in (("a-1-py3-none-any.whl", 1000), ("b-2-cp312-x86_64.whl", 2500)):
            (dest / name).write_bytes(b"w" * size)
        (dest / "notes.txt").write_text("not a wheel")
        return 0
    monkeypatch.setattr(wheelhouse, "_run", pip)
    record = tmp_path / "wheelhouse.json"
    assert wheelhouse.main(["download", "--dest", str(tmp_path / "wh"), "--record",
                            str(record)]) == 0
    assert f"wheelhouse: 2 wheels, 0 MB in {tmp_path / 'wh'}" in capsys.readouterr().out
    entry = json.loads(record.read_text())["entries"]["python 3.12 x86_64"]
    assert entry["figures"] == {"python": "3.12", "platform": "x86_64", "wheels": 2,
                                "bytes": 3500}
    assert entry["command"].startswith("python benchmarks/wheelhouse.py download --dest ")


def test_install_adds_only_what_is_missing_then_the_project(wheelhouse, capsys, monkeypatch,
                                                            tmp_path):
    assert wheelhouse.main(["install", "--from", str(tmp_path), "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert f"torch {__import__('torch').__version__}" in printed
    commands = [line for line in printed.splitlines() if line.startswith("$ ")]
    assert commands == [f"$ {sys.executable} -m pip install --disable-pip-version-check "
                        f"--no-deps --no-build-isolation -e {ROOT}"]  # all present here
    monkeypatch.setattr(wheelhouse, "missing_here", lambda: ["nbval>=0.11"])
    assert wheelhouse.main(["install", "--from", str(tmp_path), "--dry-run"]) == 0
    first = [line for line in capsys.readouterr().out.splitlines() if line.startswith("$ ")][0]
    assert first.endswith(f"--no-index --find-links {tmp_path} nbval>=0.11")
    assert wheelhouse.main(["install", "--dry-run"]) == 2  # missing, and no wheelhouse
    assert "make wheelhouse" in capsys.readouterr().err


def test_make_gpu_check_uses_the_given_python_and_never_installs_torch(tmp_path):
    out = subprocess.run(["make", "-n", "gpu-check", "GPU_PYTHON=/opt/torch/bin/python3",
                          f"WHEELHOUSE={tmp_path}", "GPU_CHECK_ARGS=--budget 400"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    assert f"/opt/torch/bin/python3 benchmarks/wheelhouse.py install --from {tmp_path}" in out
    assert "/opt/torch/bin/python3 benchmarks/gpu_check.py --budget 400" in out
    assert "torch==" not in out and "-m venv" not in out  # no .venv set-up, no torch
    out = subprocess.run(["make", "-n", "wheelhouse", "WHEEL_PYTHON=3.11"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    assert "benchmarks/wheelhouse.py download --python 3.11 --platform x86_64" in out
