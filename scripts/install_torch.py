"""Install torch into a Python environment: the CPU build, unless told otherwise.

PyPI's torch for Linux is the CUDA build (several GB with its NVIDIA libraries); PyTorch's own
CPU index (https://download.pytorch.org/whl/cpu, "Start Locally" on pytorch.org) holds the CPU
build, about a tenth of that. So, by default:

* a torch already installed and inside the range pyproject.toml accepts is kept (a GPU user's
  CUDA build, installed first), unless a spec or an index is named (`--replace`);
* on Linux, `PIN` is installed from PyTorch's CPU index; elsewhere (macOS, Windows) from pip's
  configured index, whose wheel there is the CPU (or MPS) build;
* the CPU index is probed first (one request, `PROBE_S` seconds at most: pip itself retries an
  unreachable index for minutes); when it cannot be reached, the install falls back to pip's
  configured index and says so (a pip configuration with ``find-links`` to a local CPU wheel
  still gets the CPU build; plain PyPI gets the CUDA one).

``--index URL`` names another index (a CUDA one: https://download.pytorch.org/whl/cu126), used
as given, with no fallback; ``--index default`` is pip's configured index. The Makefile (`make
setup`, TORCH_SPEC= / TORCH_INDEX=) and the Gradescope bundle's setup.sh (same variables) run
this script; ``--dry-run`` prints what it would run, and runs nothing.

Standard library only: it runs before anything else is installed.

Usage: python scripts/install_torch.py [--python PY] [--spec SPEC] [--index auto|default|URL]
                                       [--replace] [--dry-run] [--assume-reachable yes|no]
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

PIN = "torch==2.13.0"
"""The torch every course machine installs by default (binder/requirements.txt: the same, +cpu)."""
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PROBE_S = 5.0
"""Seconds the reachability probe of the CPU index may take (a DNS failure takes none)."""
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


@dataclass(frozen=True)
class Plan:
    """What to do: the pip command to run (None: keep the torch there is) and why, in words."""

    command: list[str] | None
    says: list[str]


def supported_range(pyproject: Path = PYPROJECT) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(lowest, first unsupported) torch version from pyproject's ``torch>=A,<B``."""
    m = re.search(r'"torch>=([\d.]+),<([\d.]+)"', pyproject.read_text())
    if not m:
        raise SystemExit(f"{pyproject}: expected a dependency \"torch>=A,<B\"")
    return _version(m.group(1)), _version(m.group(2))


def _version(text: str) -> tuple[int, ...]:
    """2.13.0+cpu -> (2, 13, 0); a pre-release's suffix is dropped (2.14.0a0 -> (2, 14, 0))."""
    return tuple(int(re.match(r"\d+", part).group()) for part in
                 text.split("+")[0].split(".")[:3] if re.match(r"\d+", part))


def installed_torch(python: str) -> str | None:
    """The torch version `python` has installed, or None."""
    code = "import importlib.metadata as m; print(m.version('torch'))"
    done = subprocess.run([python, "-c", code], capture_output=True, text=True)
    return done.stdout.strip() or None if done.returncode == 0 else None


def reachable(url: str, timeout: float = PROBE_S) -> tuple[bool, str]:
    """(whether `url` answers within `timeout` seconds, why not)."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout):
            return True, ""
    except (urllib.error.URLError, OSError, ValueError) as err:
        return False, str(getattr(err, "reason", err))


def plan(*, python: str, spec: str, index: str, replace: bool, platform: str,
         installed: str | None, supported: tuple[tuple[int, ...], tuple[int, ...]],
         probe=reachable) -> Plan:
    """The install to run, decided from the arguments and what is there (pure but `probe`)."""
    lo, hi = supported
    span = f">={'.'.join(map(str, lo))},<{'.'.join(map(str, hi))}"
    if installed and not replace:
        if lo <= _version(installed) < hi:
            return Plan(None, [f"keeping torch {installed} (pyproject.toml accepts {span}); "
                               "to replace it, name one: TORCH_SPEC=... or TORCH_INDEX=..."])
        says = [f"torch {installed} is outside {span}: installing {spec}"]
    else:
        says = []
    pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    if index == "default" or (index == "auto" and not platform.startswith("linux")):
        return Plan(pip + [spec], says + [f"installing {spec} from pip's configured index"])
    if index != "auto":
        return Plan(pip + ["--index-url", index, spec], says + [f"installing {spec} from {index}"])
    ok, why = probe(f"{CPU_INDEX}/torch/")
    if ok:
        return Plan(pip + ["--index-url", CPU_INDEX, spec],
                    says + [f"installing {spec}, the CPU build, from {CPU_INDEX}"])
    return Plan(pip + [spec], says + [
        f"PyTorch's CPU index {CPU_INDEX} cannot be reached ({why}): installing {spec} from "
        "pip's configured index instead. From plain PyPI that is the CUDA build (several GB); "
        "a pip configuration with find-links to a CPU wheel gets the CPU one. Another index: "
        "TORCH_INDEX=URL"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="exit status: 0 installed or kept; pip's own status "
                                 "when the install fails; 2 for bad arguments")
    ap.add_argument("--python", default=sys.executable, help="the environment's python "
                    "(default: the one running this)")
    ap.add_argument("--spec", default=PIN, help=f"what to install (default {PIN})")
    ap.add_argument("--index", default="auto", help="auto (the CPU index on Linux, with a "
                    "fallback), default (pip's configured index) or an index URL")
    ap.add_argument("--replace", action="store_true", help="install even when a supported "
                    "torch is there (naming a spec or an index implies it)")
    ap.add_argument("--dry-run", action="store_true", help="print the pip command, run nothing")
    ap.add_argument("--assume-reachable", choices=("yes", "no"), help="skip the probe of the "
                    "CPU index and take this as its answer (tests; a known network)")
    args = ap.parse_args(argv)
    named = args.spec != PIN or args.index != "auto"
    probe = reachable if args.assume_reachable is None else \
        (lambda _url: (args.assume_reachable == "yes", "assumed unreachable"))
    decided = plan(python=args.python, spec=args.spec, index=args.index,
                   replace=args.replace or named, platform=sys.platform,
                   installed=installed_torch(args.python), supported=supported_range(),
                   probe=probe)
    for line in decided.says:
        print(f"install_torch: {line}", flush=True)
    if decided.command is None:
        return 0
    print(("would run: " if args.dry_run else "") + shlex.join(decided.command), flush=True)
    return 0 if args.dry_run else subprocess.run(decided.command).returncode


if __name__ == "__main__":
    sys.exit(main())
