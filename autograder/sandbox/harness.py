"""What runs inside each rank of a submission: import the student's module, call it on the
check's inputs, and send back plain observations. Nothing here decides a grade.

Everything a rank returns is plain data (dicts, lists, str, int, float, bytes): tensors as
dtype + shape + raw bytes, traffic as counts. The grader turns that into verdicts in its own
process, where no student code ever runs, so patching `torch.allclose` or the recorder inside a
rank cannot change a comparison. What *can* be changed in a rank is watched: after every call
the harness checks that torch.distributed's functions are still the recorder's wrappers and
that no function or method of the recorder or of this harness was replaced (`tampered`: a
patched ``Trace.totals`` could report a tree's message counts for a linear broadcast), and notes
the bytes the process wrote to the kernel (``/proc/self/io`` wchar), which the grader compares
with the recorded messages (traffic no wrapper saw: a built-in collective behind a patched
recorder, files used as a side channel).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import inspect
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from toolkit import comm
from toolkit.comm.kernel_io import written_bytes
from toolkit.comm.patch import SPECS

from . import landlock


class _Forbidden(importlib.abc.MetaPathFinder):
    """Refuses imports the lab forbids (e.g. the toolkit's own collectives in lab 01)."""

    def __init__(self, names: list[str]) -> None:
        self.names = names

    def find_spec(self, fullname, path=None, target=None):
        if any(fullname == n or fullname.startswith(n + ".") for n in self.names):
            raise ImportError(f"{fullname} may not be used in this lab: write the algorithm "
                              f"yourself from send/recv (the grader blocks this import)")
        return None


def _wrappers() -> dict[str, Any]:
    # The objects themselves, not their id(): a replaced wrapper may be freed and its id
    # reused by the next object allocated, which would hide the replacement.
    return {f"{ns.__name__}.{name}": getattr(ns, name, None)
            for ns in (dist, c10d) for name in SPECS}


# The modules whose code turns a case into observations: the recorder (its totals decide the
# traffic checks) and this harness. A submission that rebinds one of their functions or
# methods, or swaps a function's code object, could report any traffic it likes.
_INSTRUMENTS = ("toolkit.comm", "toolkit.comm.patch", "toolkit.comm.recorder",
                "toolkit.comm.events", "toolkit.comm.inflight", "toolkit.comm.kernel_io",
                "toolkit.launch.worker", __name__)


def _identity(obj: Any) -> tuple[Any, Any] | None:
    """(object, code object) held by reference, so neither can be freed and its id reused."""
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if isinstance(obj, property):
        return obj.fget, getattr(obj.fget, "__code__", None)
    if inspect.isfunction(obj) or inspect.isbuiltin(obj) or inspect.isclass(obj):
        return obj, getattr(obj, "__code__", None)
    return None


def _instruments() -> dict[str, tuple[Any, Any]]:
    """Name → identity of every function, class and method in `_INSTRUMENTS`."""
    out: dict[str, tuple[int, int]] = {}
    for modname in _INSTRUMENTS:
        module = sys.modules.get(modname)
        for name, obj in list(vars(module).items()) if module else []:
            ident = _identity(obj)
            if ident is None:
                continue
            out[f"{modname}.{name}"] = ident
            if inspect.isclass(obj) and obj.__module__ == modname:
                for attr, member in list(vars(obj).items()):
                    ident = _identity(member)
                    if ident is not None:
                        out[f"{modname}.{name}.{attr}"] = ident
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
        return all(x is y for x, y in zip(a, b))
    return a is b


def _tampered(before: dict, after: dict) -> list[str]:
    return sorted(k for k in before.keys() | after.keys() if not _same(after.get(k), before.get(k)))


def _wchar() -> int:
    written = written_bytes()
    return -1 if written is None else written


def _printed() -> int:
    """Bytes in this rank's log so far (prints count in wchar; they are not messages)."""
    try:
        return os.fstat(1).st_size
    except OSError:
        return 0


def encode(value: Any) -> Any:
    """Tensors (also inside lists, tuples and dicts) as plain data the grader can decode."""
    if isinstance(value, torch.Tensor):
        t = value.detach().to("cpu").contiguous()
        return {"__tensor__": True, "dtype": str(t.dtype).removeprefix("torch."),
                "shape": list(t.shape), "data": t.view(torch.uint8).numpy().tobytes()
                if t.numel() else b""}
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {str(k): encode(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return {"__unsupported__": type(value).__name__}


def _redirect_output(workdir: Path, tag: str, rank: int) -> None:
    """Send this rank's stdout and stderr to a log file the grader reads (and sizes)."""
    logs = workdir / "logs"
    logs.mkdir(exist_ok=True)
    fd = os.open(logs / f"{tag}.rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False, errors="replace")
    sys.stderr = open(2, "w", buffering=1, closefd=False, errors="replace")


def load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _confine_rank(workdir: Path, job: dict) -> None:
    """Take the grader's own files out of this rank's reach before any student code runs.

    The supervisor writes its records (``observations.jsonl``) in the working folder, and a
    rank, a fork of it, shares its Landlock domain and inherits the open file: a submission
    could append a perfect record for every check and kill the supervisor before the real
    ones follow (fault ``forge_observations``). So each rank closes every inherited
    descriptor of that file and stacks a second Landlock layer on the supervisor's: reading
    stays as the supervisor's layer allows, writing only in ``tmp/`` (TMPDIR), ``logs/`` and
    /dev. Being more confined than the supervisor also bars the rank from ptrace-ing it or
    writing its memory (Landlock refuses to trace a less confined process).
    """
    record = (workdir / "observations.jsonl").resolve()
    for fd in os.listdir("/proc/self/fd"):
        try:
            if Path(os.readlink(f"/proc/self/fd/{fd}")) == record:
                os.close(int(fd))
        except (OSError, ValueError):
            pass
    if job.get("landlock", True) and landlock.abi_version() >= 1:
        (workdir / "tmp").mkdir(exist_ok=True)
        landlock.restrict(read=["/"], write=[str(workdir / "tmp"), str(workdir / "logs"), "/dev"])


def run_group(rank: int, world_size: int, job: dict, group: dict) -> list[dict]:
    """Run every case of one check group on this rank; return one observation per case."""
    workdir = Path(job["workdir"])
    _redirect_output(workdir, group["id"].replace("/", "_"), rank)
    _confine_rank(workdir, job)
    sys.meta_path.insert(0, _Forbidden(job.get("forbidden_imports", [])))
    sys.path.insert(0, str(workdir))
    comm.install()
    # Held in locals: rebinding the module's names from the submission cannot swap the checks.
    wrappers, snapshot, tampered_since = _wrappers, _instruments, _tampered
    before, instruments = wrappers(), snapshot()
    lab = load_module(workdir / "_lab_harness.py", "_lab_harness")
    student = load_module(workdir / f"{job['module']}.py", job["module"])
    observations = []
    for case in group["cases"]:
        wchar0, printed0 = _wchar(), _printed()
        with comm.recording() as trace:
            start = time.perf_counter()
            out = lab.CALLS[case["call"]](student, rank, world_size, case)
            seconds = time.perf_counter() - start
        wchar, printed = _wchar() - wchar0, _printed() - printed0
        # Compared before the recorder is asked for anything: a patched totals() lies.
        tampered = tampered_since(before, wrappers()) + tampered_since(instruments, snapshot())
        totals = trace.totals().get(rank)
        builtin = sorted({e.op for e in trace if e.op not in comm.P2P_OPS})
        observations.append({
            "case": case["id"], "rank": rank, "seconds": seconds, "output": encode(out),
            "bytes_sent": totals.bytes_sent if totals else 0,
            "bytes_received": totals.bytes_received if totals else 0,
            "messages_sent": totals.messages_sent if totals else 0,
            "messages_received": totals.messages_received if totals else 0,
            "builtin_ops": builtin, "wchar": wchar, "printed": printed,
            "collective_bytes": totals.collective_bytes if totals else 0,
            "calls": dict(totals.calls) if totals else {},
            "tampered": tampered,
            "forbidden_loaded": sorted(n for n in job.get("forbidden_imports", [])
                                       if n in sys.modules),
        })
    sys.stdout.flush()
    sys.stderr.flush()
    return observations


__all__ = ["encode", "load_module", "run_group"]
