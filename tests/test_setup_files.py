"""The set-up files agree with each other: one torch version, binder installs the project and
opens where the README's Binder badge says; `make setup` and Gradescope's setup.sh install torch
with the commands scripts/install_torch.py decides (the CPU build from PyTorch's CPU index on
Linux, a fallback when it cannot be reached, a supported torch kept)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch

from autograder.edition import binder_url

ROOT = Path(__file__).resolve().parents[1]


def makefile_torch() -> str:
    """The course's torch pin (scripts/install_torch.py, which `make setup` runs)."""
    m = re.search(r'^PIN = "torch==(\S+)"', (ROOT / "scripts" / "install_torch.py").read_text(),
                  re.M)
    assert m, 'scripts/install_torch.py must pin PIN = "torch==X.Y.Z"'
    return m.group(1)


def test_binder_pins_the_makefiles_torch_as_a_cpu_build():
    req = (ROOT / "binder" / "requirements.txt").read_text()
    assert f"torch=={makefile_torch()}+cpu" in req.split()
    assert "whl/cpu" in req


def test_installed_torch_is_the_pinned_one():
    assert torch.__version__.split("+")[0] == makefile_torch()


def test_pyproject_range_admits_the_pin():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (spec,) = [d for d in deps if d.startswith("torch")]
    lo, hi = re.match(r"torch>=([\d.]+),<([\d.]+)", spec).groups()
    version = tuple(map(int, makefile_torch().split(".")))
    assert tuple(map(int, lo.split("."))) <= version < tuple(map(int, hi.split(".")))


def test_binder_post_build_installs_the_project_and_is_executable():
    post = ROOT / "binder" / "postBuild"
    assert os.access(post, os.X_OK)
    assert "pip install" in post.read_text() and "-e ." in post.read_text()
    runtime = (ROOT / "binder" / "runtime.txt").read_text().strip()
    assert re.fullmatch(r"python-3\.\d+", runtime)


def test_binder_runtime_satisfies_requires_python():
    tomllib = pytest.importorskip("tomllib")
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    lo = re.fullmatch(r">=\s*3\.(\d+)", requires).group(1)
    runtime = (ROOT / "binder" / "runtime.txt").read_text().strip()
    assert int(runtime.split(".")[1]) >= int(lo), (runtime, requires)


def test_binder_links_open_the_rendered_lesson_map():
    """Every Binder link (the student README's badge, the site's "run it live") is
    `edition.binder_url` of the one configured repository; it opens a file that exists."""
    url = binder_url("owner/course-student")
    m = re.fullmatch(r"https://mybinder\.org/v2/gh/owner/course-student/HEAD"
                     r"\?urlpath=lab/tree/(\S+)", url)
    assert m and (ROOT / m.group(1)).is_file(), url
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        assert "mybinder.org/v2" not in doc.read_text(), f"{doc.name} types a Binder link"
    # A .md opens as source text in JupyterLab unless a setting says "Markdown Preview";
    # postBuild installs that setting from binder/overrides.json.
    overrides = json.loads((ROOT / "binder" / "overrides.json").read_text())
    viewers = overrides["@jupyterlab/docmanager-extension:plugin"]["defaultViewers"]
    assert viewers["markdown"] == "Markdown Preview"
    assert "binder/overrides.json" in (ROOT / "binder" / "postBuild").read_text()


def test_ci_runs_the_readme_test_command():
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "make lab" in readme and "make test" in readme
