"""A folder format for measured sweeps, so a GPU node's run can sit beside a laptop's.

    results/<name>/
        results.csv     one row per (collective, algorithm, p, size): the `measure` table
        meta.json       where and how it was measured: host, backend, device, torch, date, args
        report.html     plotly report (written by benchmarks/collectives.py)
        device.json     this GPU's own figures: matmul per dtype, copy bandwidths
                        (benchmarks/gpu_figures.py; `load_device_figures`)
        ...             `make gpu-check` adds ddp_step.csv, fsdp_step.csv, lessons.csv and more

`save_results` writes the first two; `load_results` reads a folder back into (table, meta), and
`load_all` stacks several with a ``run`` column, e.g. to draw "your laptop vs an 8-GPU node";
`find_results` lists the folders under a few roots (lessons 03 and 04 look in
``lessons/data/runs`` and the repository's ``results/``). `save_device_figures` /
`load_device_figures` / `find_device_figures` do the same for a device's measured peaks.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

FORMAT = 1  # bump when the columns or meta keys change meaning


def machine_meta(backend: str, *, gpus: list[str] | None = None) -> dict[str, Any]:
    """What a reader needs to judge the numbers: the machine, the backend, the versions.

    `gpus` names the GPUs the run used (`toolkit.launch.visible_gpus`, which asks NVML):
    this module never asks torch.cuda, which would start the CUDA driver in a process that may
    fork ranks next."""
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
    if gpus:
        meta["gpus"] = list(gpus)
        meta["cuda"] = torch.version.cuda
        try:  # the library's version number: no device, no driver
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
    csv = folder / "results.csv"
    missing = (f"{folder} is not a results folder: it needs results.csv and meta.json (written "
               "by benchmarks/collectives.py --out)")
    if not csv.is_file():
        raise FileNotFoundError(missing)
    info = _read_versioned(folder / "meta.json", FORMAT, missing, "re-run the benchmark")
    return pd.read_csv(csv), info


def _read_versioned(path: Path, version: int, missing: str, redo: str) -> dict[str, Any]:
    """The JSON object in `path`, whose ``format`` must be `version` (else: what to `redo`)."""
    if not path.is_file():
        raise FileNotFoundError(missing)
    data = json.loads(path.read_text())
    if data.get("format") != version:
        raise ValueError(f"{path}: format {data.get('format')!r}, this toolkit reads "
                         f"{version}; {redo}")
    return data


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


DEVICE_FIGURES = "device.json"
DEVICE_FORMAT = 1  # bump when device.json's keys change meaning


def save_device_figures(figures: dict[str, Any], folder: str | os.PathLike) -> Path:
    """Write a device's measured figures (benchmarks/gpu_figures.py) to `folder`/device.json,
    through a temporary name (no half-written file); returns the file's path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tmp, path = folder / f".{DEVICE_FIGURES}.tmp", folder / DEVICE_FIGURES
    tmp.write_text(json.dumps({"format": DEVICE_FORMAT, **figures}, indent=2) + "\n")
    os.replace(tmp, path)
    return path


@dataclass(frozen=True)
class DeviceFigures:
    """One device's measured peaks, as lessons 06 (roofline, MFU) and 09 (offload tiers) set
    them beside a datasheet.

    `matmul`: one row per dtype (fp32 with TF32 off, tf32, bf16, fp16 on a GPU; fp32 and bf16
    in a CPU rehearsal) with columns dtype, n, flops (2n³), seconds (median), tflops.
    `copies`: one row per (kind, memory): kind h2d / d2h / d2d (h2h on a CPU), memory pinned /
    pageable / device, columns bytes (counted: a d2d copy reads and writes, 2× its size),
    seconds, gb_per_s (1e9 bytes/s). `name` is the device's name ("cpu" for a rehearsal),
    `info` the rest of device.json (memory_bytes, multiprocessors, capability, meta)."""

    name: str
    matmul: Any
    copies: Any
    info: dict[str, Any]

    def peak_tflops(self, dtype: str) -> float:
        """Measured matmul TFLOP/s for `dtype` ("fp32", "tf32", "bf16", "fp16")."""
        rows = self.matmul[self.matmul.dtype == dtype]
        if rows.empty:
            raise KeyError(f"{self.name}: no {dtype} matmul measured (have "
                           f"{', '.join(self.matmul.dtype)})")
        return float(rows.tflops.iloc[0])

    def bandwidth(self, kind: str, memory: str) -> float:
        """Measured copy bandwidth in GB/s (1e9 bytes/s) for `kind` (h2d, d2h, d2d) from
        `memory` (pinned, pageable, device)."""
        rows = self.copies[(self.copies.kind == kind) & (self.copies.memory == memory)]
        if rows.empty:
            raise KeyError(f"{self.name}: no {kind} copy from {memory} memory measured")
        return float(rows.gb_per_s.iloc[0])


def load_device_figures(folder: str | os.PathLike) -> DeviceFigures:
    """The figures `save_device_figures` wrote into `folder` (a `make gpu-check` results
    folder), as a `DeviceFigures`."""
    import pandas as pd

    data = _read_versioned(Path(folder) / DEVICE_FIGURES, DEVICE_FORMAT,
                           f"{folder} has no {DEVICE_FIGURES}: run benchmarks/gpu_figures.py "
                           "--out FOLDER (make gpu-check does)", "measure again")
    info = {k: v for k, v in data.items() if k not in ("format", "name", "matmul", "copies")}
    return DeviceFigures(data["name"], pd.DataFrame(data["matmul"]),
                         pd.DataFrame(data["copies"]), info)


def find_device_figures(*roots: str | os.PathLike) -> list[Path]:
    """The folders directly under each of `roots` that hold a device.json, by name."""
    found = [p.parent for root in roots for p in Path(root).glob(f"*/{DEVICE_FIGURES}")]
    return sorted(found, key=lambda p: (p.name, str(p)))
