"""A Gradescope autograder bundle for one lab: a zip with ``setup.sh`` and ``run_autograder``.

Gradescope's specification: the zip's root holds ``setup.sh`` (run once, as root, to build the
image; the zip is unpacked in ``/autograder/source``) and ``run_autograder`` (run per
submission, with the student's files in ``/autograder/submission``; it must write
``/autograder/results/results.json``). The bundle carries this project's source (toolkit,
autograder, the lab with its hidden checks), so grading runs the same code as `autograder grade`
here. torch is installed by the course's own ``scripts/install_torch.py``, as `make setup`
does: the CPU build from PyTorch's CPU index (falling back to PyPI, saying so, when that cannot
be reached); ``TORCH_SPEC`` / ``TORCH_INDEX`` at the top of setup.sh name another, each passed
as an argument of its own. `run_autograder` writes a zero-score results.json itself if the
grader cannot start.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SETUP = """#!/usr/bin/env bash
# Gradescope runs this once to build the autograder image (as root, in /autograder/source).
set -euo pipefail
cd /autograder/source
# Another torch than the course's pin (the CPU build): set either, e.g.
# TORCH_SPEC="torch==2.13.0" TORCH_INDEX="https://download.pytorch.org/whl/cu126".
TORCH_SPEC="${{TORCH_SPEC:-}}"
TORCH_INDEX="${{TORCH_INDEX:-}}"
if ! command -v python3 >/dev/null || ! python3 -m venv --help >/dev/null 2>&1; then
  apt-get update && DEBIAN_FRONTEND=noninteractive \\
    apt-get install -y python3 python3-venv python3-pip
fi
python3 -m venv /autograder/venv
/autograder/venv/bin/python -m pip install --quiet --upgrade pip
torch_args=()
if [ -n "$TORCH_SPEC" ]; then torch_args+=(--spec "$TORCH_SPEC"); fi
if [ -n "$TORCH_INDEX" ]; then torch_args+=(--index "$TORCH_INDEX"); fi
/autograder/venv/bin/python scripts/install_torch.py ${{torch_args[@]+"${{torch_args[@]}}"}}
/autograder/venv/bin/python -m pip install --quiet -e .
/autograder/venv/bin/python -m autograder labs --root labs
"""

RUN = """#!/usr/bin/env bash
# Gradescope runs this for every submission; results go to /autograder/results/results.json.
cd /autograder/source
mkdir -p /autograder/results
/autograder/venv/bin/python -m autograder grade /autograder/submission --lab labs/{lab} \\
    --json /autograder/results/results.json --no-color
status=$?
if [ ! -s /autograder/results/results.json ]; then
  printf '%s\\n' '{{"score": 0, "execution_time": 0, "output": "The autograder could not '\\
'start (exit status '"$status"'); please tell your instructor.", "tests": []}}' \\
    > /autograder/results/results.json
fi
exit 0
"""

_SKIP = {"__pycache__", ".ipynb_checkpoints"}


def _add_tree(zf: zipfile.ZipFile, folder: Path, arc: str) -> int:
    n = 0
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not (set(path.relative_to(folder).parts) & _SKIP):
            zf.write(path, f"{arc}/{path.relative_to(folder)}")
            n += 1
    return n


def build_bundle(lab_dir: Path, out: Path) -> Path:
    """Write the Gradescope zip for the lab in `lab_dir` to `out`; returns the path."""
    lab_dir = Path(lab_dir).resolve()
    if not (lab_dir / "checks.py").is_file():
        raise ValueError(f"{lab_dir} is not a lab folder (it has no checks.py)")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        scripts = (("setup.sh", SETUP.format()), ("run_autograder", RUN.format(lab=lab_dir.name)))
        for name, text in scripts:
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o755 << 16  # executable, as Gradescope runs them directly
            zf.writestr(info, text)
        for name in ("pyproject.toml", "README.md", "scripts/install_torch.py"):
            zf.write(ROOT / name, name)
        _add_tree(zf, ROOT / "toolkit", "toolkit")
        _add_tree(zf, ROOT / "autograder", "autograder")
        _add_tree(zf, lab_dir, f"labs/{lab_dir.name}")
    return out


__all__ = ["build_bundle"]
