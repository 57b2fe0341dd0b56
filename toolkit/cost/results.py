"""A folder format for measured sweeps, so a GPU node's run can sit beside a laptop's.

    results/<name>/
        results.csv     one row per (collective, algorithm, p, size): the `measure` table
        meta.json       where and how it was measured: host, backend, device, torch, date, args
        report.html     plotly report (written by benchmarks/collectives.py)
        ...             `make gpu-check` adds ddp_step.csv, fsdp_step.csv, lessons.csv and more

`save_results` writes the first two; `load_results` reads a folder back into (table, meta), and
`load_all` stacks several with a ``run`` column, e.g. to draw "your laptop vs an 8-GPU node";
`find_results` lists the folders under a few roots (lessons 03 and 04 look in
``lessons/data/runs`` and the repository's ``results/``).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import socket
from pathlib import Path
from typing import Any

import torch

FORMAT = 1  # bump when the columns or meta keys change meaning


def machine_meta(backend: str) -> dict[str, Any]:
    """What a reader needs to judge the numbers: the machine, the backend, the versions."""
    meta: dict[str, Any] = {
        "format": FORMAT,
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "backend": backend,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if torch.cuda.is_available():
        meta["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        meta["cuda"] = torch.version.cuda
        try:
            meta["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # noqa: BLE001 - a CPU-only or NCCL-less build
            pass
    return meta


def save_results(table, folder: str | os.PathLike, meta: dict[str, Any]) -> Path:
    """Write `table` (from `toolkit.experiments.collectives.measure`) and `meta` to `folder`;
    returns the folder.

    Written to temporary names and renamed, so an interrupted run never leaves half a file.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, write in (("results.csv", lambda f: table.to_csv(f, index=False)),
                        ("meta.json", lambda f: f.write_text(json.dumps(meta, indent=2) + "\n"))):
        tmp = folder / f".{name}.tmp"
        write(tmp)
        os.replace(tmp, folder / name)
    return folder


def load_results(folder: str | os.PathLike):
    """(table, meta) from a folder written by `save_results`."""
    import pandas as pd

    folder = Path(folder)
    csv, meta = folder / "results.csv", folder / "meta.json"
    if not csv.is_file() or not meta.is_file():
        raise FileNotFoundError(f"{folder} is not a results folder: it needs results.csv and "
                                "meta.json (written by benchmarks/collectives.py --out)")
    info = json.loads(meta.read_text())
    if info.get("format") != FORMAT:
        raise ValueError(f"{folder}: results format {info.get('format')!r}, this toolkit reads "
                         f"{FORMAT}; re-run the benchmark")
    return pd.read_csv(csv), info


def find_results(*roots: str | os.PathLike) -> list[Path]:
    """The results folders (those holding meta.json) directly under each of `roots`, by name;
    a root that does not exist holds none."""
    found = [meta.parent for root in roots for meta in Path(root).glob("*/meta.json")]
    return sorted(found, key=lambda p: (p.name, str(p)))


def load_all(folders) -> "Any":
    """Several results folders in one table, with a ``run`` column naming each folder."""
    import pandas as pd

    frames = []
    for folder in folders:
        table, _ = load_results(folder)
        frames.append(table.assign(run=Path(folder).name))
    return pd.concat(frames, ignore_index=True)
