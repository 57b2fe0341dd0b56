"""Saved measurements: each benchmark's figures beside the machine they were taken on.

A benchmark run with ``--save`` puts its figures into ``benchmarks/results/NAME.json`` (NAME:
the script's), one entry per part it measured (a world size, a lab, a collective), replacing
that part's earlier entry and keeping the others:

    {"about": "what the figures are",
     "script": "benchmarks/NAME.py",
     "entries": {KEY: {"command": "python benchmarks/NAME.py --steps 10",
                       "machine": {"cpus": 2, "load_before": 9.1, "load_after": 9.6,
                                   "date": "2026-11-28", "commit": "5afbcc0", "torch": "2.13.0"},
                       "figures": {...}}}}

The load is the 1-minute load average just before and after the part ran: above the machine's
cores, other work shared it and times are longer than on an idle machine (ratios and byte
counts hold better). `benchmarks/figures_page.py` writes docs/figures.md, and the measured
sentences of docs/grading.md, from these files. Files are written to a temporary name and
renamed, so an interrupted run never leaves half a file; ``--record FILE.json`` writes another
file (tests use it).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def path_of(name: str) -> Path:
    """Where benchmark `name` (benchmarks/NAME.py) saves its figures."""
    return RESULTS / f"{name}.json"


CODE = ["toolkit", "autograder", "labs", "benchmarks", ":!benchmarks/results"]
"""What decides the figures: a change here, not yet committed, is marked on the commit."""


def commit() -> str:
    """The checkout's short commit, with "+changes" when the code differs from it ("" outside
    git): which code took the figures."""
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                          capture_output=True)
    if done.returncode != 0:
        return ""
    changed = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", *CODE], cwd=ROOT,
                             capture_output=True).returncode == 1
    return done.stdout.strip() + ("+changes" if changed else "")


def load_average() -> float:
    """The 1-minute load average, rounded as it is saved."""
    return round(os.getloadavg()[0], 2)


def machine(load_before: float) -> dict[str, Any]:
    """The machine a part ran on: cores, the load just before (`load_before`, from
    `load_average()`) and now, the date (UTC), the commit, torch's version."""
    try:
        torch = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch = ""
    return {"cpus": os.cpu_count(), "load_before": load_before, "load_after": load_average(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
            "commit": commit(), "torch": torch}


def command(script: str, argv: list[str] | None) -> str:
    """The command line that reproduces a run, without the saving options."""
    argv = list(sys.argv[1:] if argv is None else argv)
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--save":
            continue
        elif arg == "--record":
            skip = True
        elif not arg.startswith("--record="):
            kept.append(arg)
    return " ".join(["python", f"benchmarks/{script}.py", *map(shlex.quote, kept)])


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    """``--save`` (into `path_of(name)`) and ``--record FILE.json`` (into another file)."""
    parser.add_argument("--save", action="store_true",
                        help=f"record the figures in {path_of(name).relative_to(ROOT)} with the "
                        "machine they were taken on (docs/figures.md is written from it)")
    parser.add_argument("--record", type=Path, metavar="FILE.json",
                        help="record them in FILE.json instead")


def target(parser: argparse.ArgumentParser, args: argparse.Namespace, name: str) -> Path | None:
    """The file ``--save`` / ``--record`` asked for, or None; a bad name is the parser's error."""
    if args.record is not None:
        if args.record.suffix != ".json":
            parser.error(f"--record {args.record}: expected a .json file")
        return args.record
    return path_of(name) if args.save else None


def write(path: Path, key: str, entry: dict[str, Any], *, about: str, section: str = "entries",
          script: str | None = None) -> None:
    """Put `entry` under `section`/`key` of the JSON file `path`, keeping every other entry;
    written to a temporary file and renamed, so readers never see half a file."""
    data = json.loads(path.read_text()) if path.exists() else {}
    data.setdefault("about", about)
    if script is not None:
        data.setdefault("script", script)
    entries = data.setdefault(section, {})
    entries[key] = entry
    data[section] = dict(sorted(entries.items()))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def rounded(value: Any) -> Any:
    """`value` with every float to 6 significant digits (readable files, honest precision)."""
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v) for v in value]
    return value


def record(path: Path | None, name: str, key: str, figures: dict[str, Any], *, about: str,
           load_before: float, argv: list[str] | None) -> None:
    """Save one part's `figures` (with the machine and the command) into `path`, if any."""
    if path is None:
        return
    write(path, key, {"command": command(name, argv), "machine": machine(load_before),
                      "figures": rounded(figures)}, about=about, script=f"benchmarks/{name}.py")
    print(f"saved {key!r} in {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}",
          flush=True)


def entries(name: str, folder: Path = RESULTS) -> dict[str, dict[str, Any]]:
    """The saved entries of benchmark `name` ({} when it was never saved)."""
    path = folder / f"{name}.json"
    return json.loads(path.read_text()).get("entries", {}) if path.exists() else {}
