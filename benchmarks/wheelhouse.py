"""Run `make gpu-check` on a GPU node without internet: a folder of wheels made elsewhere, and
an install from it into the Python that already holds the node's CUDA torch.

    # on a connected machine (any OS): wheels for the node's Python version and platform
    python benchmarks/wheelhouse.py download --python 3.12 --platform x86_64 --dest wheelhouse
    # on the GPU node, with the repository and the wheelhouse copied over
    /opt/torch/bin/python3 benchmarks/wheelhouse.py install --from wheelhouse

`download` asks pip for every dependency the GPU check needs (`NEEDED`: the names, read with
their version ranges from pyproject.toml), with their own dependencies, as wheels for the given
CPython version and Linux platform (``pip download --only-binary=:all: --python-version
--platform``): most are pure Python, a few (numpy, pandas, psutil, pyzmq) are built per
platform. Never torch: the node keeps its own CUDA build, and nothing the check needs depends
on torch.

`install` (what `make gpu-check GPU_PYTHON=...` runs first) checks that this Python imports
torch, installs from the folder only what is missing (``pip install --no-index
--find-links``), then the project itself, editable and without touching dependencies
(``pip install --no-deps --no-build-isolation -e .``: the grader's fork server imports
`autograder` as a package, which PYTHONPATH alone does not give it). Without nbval the suite's
pytest options do not parse: the GPU check runs pytest with ``-o addopts=``.

``--dry-run`` prints the pip commands without running them. `download` ends by saying how many
wheels the folder holds and their size; with ``--save`` it records them in
benchmarks/results/wheelhouse.json (docs/cluster.md's figure is written from it).
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import saved  # noqa: E402  (benchmarks/saved.py)

NEEDED = ("numpy", "cloudpickle", "psutil", "pandas", "plotly", "ipywidgets", "pytest",
          "pytest-timeout", "pytest-xdist", "nbval", "nbclient", "ipykernel")
"""What `make gpu-check` imports besides torch: the toolkit, the grader, pytest for the GPU
tests, nbclient and a kernel for the lessons, plotly and ipywidgets for their cells."""
PLATFORMS = {"x86_64": ["manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64"],
             "aarch64": ["manylinux2014_aarch64", "manylinux_2_17_aarch64",
                         "manylinux_2_28_aarch64"]}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~ ;\[]", requirement.strip(), maxsplit=1)[0].lower()


def requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The `NEEDED` requirements with the version ranges pyproject.toml gives them."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    project = tomllib.loads(pyproject.read_text())["project"]
    every = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        every += extra
    chosen = {_name(r): r.split(";")[0].strip() for r in every if _name(r) in NEEDED}
    missing = [n for n in NEEDED if n not in chosen]
    if missing:
        raise ValueError(f"pyproject.toml no longer lists {', '.join(missing)}: update "
                         "benchmarks/wheelhouse.py's NEEDED")
    return [chosen[n] for n in NEEDED]


def download_command(python: str, platform: str, dest: Path) -> list[str]:
    if platform not in PLATFORMS:
        raise ValueError(f"--platform {platform!r}: one of {', '.join(PLATFORMS)}")
    if not re.fullmatch(r"3\.\d+", python):
        raise ValueError(f"--python {python!r}: a version like 3.12")
    tags = [arg for tag in PLATFORMS[platform] for arg in ("--platform", tag)]
    return [sys.executable, "-m", "pip", "download", "--dest", str(dest), "--only-binary=:all:",
            "--python-version", python, "--implementation", "cp", *tags, *requirements()]


def missing_here() -> list[str]:
    """The `NEEDED` requirements this Python has no distribution of."""
    out = []
    for req in requirements():
        try:
            metadata.version(_name(req))
        except metadata.PackageNotFoundError:
            out.append(req)
    return out


def install_commands(wheels: Path | None) -> list[list[str]]:
    py = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check"]
    missing = missing_here()
    cmds = []
    if missing:
        if wheels is None:
            raise ValueError(f"{sys.executable} lacks {', '.join(missing)}; give a wheelhouse "
                             "(--from DIR, made with `make wheelhouse` on a connected machine) "
                             "or install them with pip where there is internet")
        cmds.append([*py, "--no-index", "--find-links", str(wheels), *missing])
    cmds.append([*py, "--no-deps", "--no-build-isolation", "-e", str(ROOT)])
    return cmds


def wheels_in(dest: Path) -> dict[str, int]:
    """How many wheels `dest` holds and their bytes: what is copied to the node."""
    found = [p for p in dest.glob("*.whl") if p.is_file()]
    return {"wheels": len(found), "bytes": sum(p.stat().st_size for p in found)}


def _run(cmds: list[list[str]], dry_run: bool) -> int:
    for cmd in cmds:
        print("$ " + " ".join(cmd), flush=True)
        if not dry_run and subprocess.run(cmd).returncode != 0:
            return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    sub = ap.add_subparsers(dest="command", required=True)
    d = sub.add_parser("download", help="on a connected machine: wheels into DEST")
    d.add_argument("--python", default="3.12", help="the node's Python version (default 3.12)")
    d.add_argument("--platform", default="x86_64", choices=sorted(PLATFORMS))
    d.add_argument("--dest", type=Path, default=ROOT / "wheelhouse")
    d.add_argument("--dry-run", action="store_true", help="print the pip command only")
    saved.add_arguments(d, "wheelhouse")
    i = sub.add_parser("install", help="on the GPU node: what is missing, then the project")
    i.add_argument("--from", dest="wheels", type=Path, help="the wheelhouse folder")
    i.add_argument("--dry-run", action="store_true", help="print the pip commands only")
    args = ap.parse_args(argv)
    try:
        if args.command == "download":
            save_to, load_before = saved.target(d, args, "wheelhouse"), saved.load_average()
            if _run([download_command(args.python, args.platform, args.dest)], args.dry_run):
                return 1
            if not args.dry_run:
                held = wheels_in(args.dest)
                print(f"wheelhouse: {held['wheels']} wheels, {held['bytes'] / 1e6:.0f} MB in "
                      f"{args.dest}", flush=True)
                saved.record(save_to, "wheelhouse", f"python {args.python} {args.platform}",
                             {"python": args.python, "platform": args.platform, **held},
                             about="What `make wheelhouse` downloads for a GPU node without "
                             "internet: wheels and bytes, per Python version and platform.",
                             load_before=load_before, argv=argv)
            return 0
        try:
            import torch
        except ImportError:
            raise ValueError(f"{sys.executable} has no torch: install the node's CUDA build of "
                             "torch into it first (this never installs torch)") from None
        print(f"{sys.executable}: torch {torch.__version__} (CUDA {torch.version.cuda})",
              flush=True)
        if args.wheels is not None and not args.wheels.is_dir():
            raise ValueError(f"--from {args.wheels}: no such folder")
        return _run(install_commands(args.wheels), args.dry_run)
    except ValueError as err:
        print(f"wheelhouse: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
