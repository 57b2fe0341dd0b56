"""scripts/install_torch.py and the commands that run it: `make setup` and Gradescope's setup.sh.

What each decides is checked from its own words (the script's `plan`, `make -n`, the bundle's
setup.sh run with --dry-run): the CPU build from PyTorch's CPU index on Linux, pip's own index
elsewhere or when the CPU index cannot be reached (said), a supported torch kept, a named spec
or index installed over it, each passed as an argument of its own.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from autograder.gradescope import build_bundle

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "install_torch.py"
_spec = importlib.util.spec_from_file_location("install_torch", SCRIPT)
install = importlib.util.module_from_spec(_spec)
sys.modules["install_torch"] = install  # dataclasses look their module up while defining
_spec.loader.exec_module(install)

RANGE = ((2, 4), (2, 15))
PIP = ["py", "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]


def decide(**kw) -> install.Plan:
    args = dict(python="py", spec="torch==2.13.0", index="auto", replace=False,
                platform="linux", installed=None, supported=RANGE,
                probe=lambda url: (True, ""))
    return install.plan(**{**args, **kw})


def test_a_fresh_linux_machine_gets_the_cpu_build_from_pytorchs_index():
    probed = []
    got = decide(probe=lambda url: probed.append(url) or (True, ""))
    assert got.command == PIP + ["--index-url", install.CPU_INDEX, "torch==2.13.0"]
    assert probed == [f"{install.CPU_INDEX}/torch/"]


def test_an_unreachable_cpu_index_falls_back_to_pips_index_and_says_so():
    got = decide(probe=lambda url: (False, "Name or service not known"))
    assert got.command == PIP + ["torch==2.13.0"]
    said = " ".join(got.says)
    assert "cannot be reached (Name or service not known)" in said and "CUDA build" in said


def test_other_systems_use_pips_index_without_probing():
    def never(url):
        raise AssertionError("probed")

    for platform in ("darwin", "win32"):
        assert decide(platform=platform, probe=never).command == PIP + ["torch==2.13.0"]
    assert decide(index="default", probe=never).command == PIP + ["torch==2.13.0"]


def test_a_supported_torch_is_kept_unless_one_is_named():
    kept = decide(installed="2.6.0+cu124")
    assert kept.command is None and "keeping torch 2.6.0+cu124" in kept.says[0]
    assert decide(installed="2.15.0").command is not None        # outside the range
    assert decide(installed="2.3.1").command is not None
    cuda = decide(installed="2.13.0+cpu", replace=True,
                  index="https://download.pytorch.org/whl/cu126")
    assert cuda.command == PIP + ["--index-url", "https://download.pytorch.org/whl/cu126",
                                  "torch==2.13.0"]


def test_the_range_is_pyprojects():
    assert install.supported_range() == ((2, 4), (2, 15))
    assert install._version("2.13.0+cpu") == (2, 13, 0) and install._version("2.14.0a0") == \
        (2, 14, 0)


def run_dry(line: str, *extra: str, env: dict | None = None) -> str:
    done = subprocess.run(["bash", "-c", line + " " + shlex.join(extra)], cwd=ROOT, text=True,
                          capture_output=True, timeout=60, env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> str:
    """A Python environment without torch: a fresh machine's .venv."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    return str(venv / "bin" / "python")


def make_lines(*variables: str) -> list[str]:
    """The torch line `make setup` runs (a forced rebuild, printed, not run)."""
    out = subprocess.run(["make", "-n", "-B", "setup", *variables], cwd=ROOT, text=True,
                         capture_output=True, timeout=60, check=True).stdout
    return [line for line in out.splitlines() if "install_torch.py" in line]


def test_make_setup_runs_the_script_with_the_named_spec_and_index(bare_python):
    (line,) = make_lines()
    assert re.fullmatch(r"\.venv/bin/python scripts/install_torch\.py\s*", line), line
    out = run_dry(line.replace(".venv/bin/python", bare_python, 1), "--dry-run",
                  "--assume-reachable", "yes")
    assert f"--index-url {install.CPU_INDEX} torch=={install.PIN.split('==')[1]}" in out
    (named,) = make_lines("TORCH_SPEC=torch==2.12.0", "TORCH_INDEX=https://x.example/cu126")
    out = run_dry(named.replace(".venv/bin/python", bare_python, 1), "--dry-run")
    assert out.splitlines()[-1].endswith("--index-url https://x.example/cu126 torch==2.12.0")


def test_gradescope_setup_installs_torch_with_separate_arguments(tmp_path, bare_python):
    bundle = build_bundle(ROOT / "labs" / "01_collectives", tmp_path / "ag.zip")
    with zipfile.ZipFile(bundle) as zf:
        setup = zf.read("setup.sh").decode()
        assert "scripts/install_torch.py" in zf.namelist()
    subprocess.run(["bash", "-n", "-c", setup], check=True, timeout=30)
    start = setup.index("torch_args=()")
    end = setup.index("\n", setup.index("scripts/install_torch.py", start))
    assigned = [line for line in setup.splitlines() if line.startswith(("TORCH_SPEC=",
                                                                         "TORCH_INDEX="))]
    lines = "\n".join(assigned + [setup[start:end]]).replace("/autograder/venv/bin/python",
                                                             bare_python)
    out = run_dry("set -euo pipefail\n" + lines, "--dry-run", "--assume-reachable", "no")
    assert "cannot be reached" in out and out.splitlines()[-1].endswith(" torch==2.13.0")
    index = "https://download.pytorch.org/whl/cu126"
    out = run_dry("set -euo pipefail\n" + lines, "--dry-run",
                  env={"TORCH_SPEC": "torch==2.13.0", "TORCH_INDEX": index})
    assert out.splitlines()[-1].endswith(f"--index-url {index} torch==2.13.0")
