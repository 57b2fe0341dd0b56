"""Importing the toolkit changes nothing: after importing any module, `torch.distributed`'s
functions (in both namespaces the recorder wraps) are torch's own.

Each module is imported in a fresh interpreter (a subprocess), so a module cannot pass because
another one, imported earlier in this process, already paid for it.
"""

from __future__ import annotations

import importlib.util
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import toolkit

ROOT = Path(__file__).resolve().parents[1]

# In the child: the functions before, then after importing each module in turn.
_CHILD = r"""
import importlib, json, sys
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

def snapshot():
    return {f"{ns.__name__}.{name}": id(obj) for ns in (dist, c10d)
            for name, obj in vars(ns).items() if callable(obj)}

before, held = snapshot(), (list(vars(dist).values()), list(vars(c10d).values()))
changed = {}
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
    after = snapshot()
    diff = sorted(k for k in before.keys() & after.keys() if before[k] != after[k])
    if diff:
        changed[name] = diff
        before = after
print(json.dumps(changed))
"""


def toolkit_modules() -> list[str]:
    """Every module of the toolkit package, sorted (packages and their modules)."""
    names = [toolkit.__name__]
    for info in pkgutil.walk_packages(toolkit.__path__, prefix="toolkit."):
        names.append(info.name)
    return sorted(names)


def test_the_walk_finds_every_module_file():
    files = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
             for p in (ROOT / "toolkit").rglob("*.py")}
    assert set(toolkit_modules()) == files


NEEDS = {"toolkit.frameworks": "pytorch_lightning",
         "toolkit.experiments.frameworks": "pytorch_lightning"}
"""Modules that need an optional package: left out where it is not installed (their own
tests skip then too)."""


def test_importing_any_toolkit_module_leaves_torch_distributed_untouched():
    modules = [m for m in toolkit_modules()
               if m not in NEEDS or importlib.util.find_spec(NEEDS[m]) is not None]
    out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(modules)], cwd=ROOT,
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    changed = json.loads(out.stdout.strip().splitlines()[-1])
    assert changed == {}, (
        "importing these modules replaced torch.distributed functions (install the recorder "
        f"where it is used, not at import): {changed}")


def test_the_check_sees_a_patch_when_one_happens():
    """The same child reports `toolkit.comm.install` as a change: the test can fail."""
    out = subprocess.run([sys.executable, "-c", _CHILD.replace(
        "importlib.import_module(name)",
        "importlib.import_module(name); importlib.import_module('toolkit.comm').install()"),
        json.dumps(["toolkit.comm"])], cwd=ROOT, capture_output=True, text=True, timeout=120)
    changed = json.loads(out.stdout.strip().splitlines()[-1])
    assert "torch.distributed.all_reduce" in changed["toolkit.comm"]
    assert "torch.distributed.distributed_c10d.isend" in changed["toolkit.comm"]
