"""One rank, after `confine` has closed every door: join the courier, import the student's
module, run the cases the grader sends, send back each output. Nothing here decides a grade.

The grader sends the cases one at a time on the rank's channel (``case`` frames: the call's
name, the case's public parameters, and this rank's inputs), and ``end`` when the launch is
over. The rank answers each with ``output`` (the value as a tensor tree, `channel.pack`) or
``error`` (the exception's type, message and traceback: text the grader never executes), then
ends with ``os._exit`` (no interpreter shutdown: torch can abort there).
"""

from __future__ import annotations

import faulthandler
import importlib.abc
import importlib.util
import os
import signal
import socket
import sys
import traceback
from pathlib import Path
from typing import Any, NoReturn

from . import backend
from .channel import pack, unpack
from .probe import Call


class _Forbidden(importlib.abc.MetaPathFinder):
    """Refuses imports the lab forbids, with words (Landlock refuses them anyway)."""

    def __init__(self, names: list[str]) -> None:
        self.names = names

    def find_spec(self, fullname, path=None, target=None):
        if any(fullname == n or fullname.startswith(n + ".") for n in self.names):
            raise ImportError(f"{fullname} may not be used in this lab: write the algorithm "
                              f"yourself from send/recv (the grader blocks this import)")
        return None


def load_module(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _error(link: backend.Link, phase: str, case: int | None, exc: BaseException) -> NoReturn:
    tb = exc.__traceback__
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - a __str__ that raises
        message = "(its message could not be printed)"
    link.send({"k": "error", "phase": phase, "case": case, "type": type(exc).__name__,
               "message": message[:4000], "traceback": text[-8000:]})
    _leave(1)


def _leave(code: int) -> NoReturn:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    os._exit(code)


def main(sock: socket.socket, spec: dict) -> NoReturn:
    """Run as rank ``spec["rank"]`` of ``spec["world_size"]``; never returns."""
    faulthandler.enable(file=sys.stderr)
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    rank, world_size = int(spec["rank"]), int(spec["world_size"])
    link = backend.Link(sock)
    device = str(spec.get("device", "cpu"))  # the grader's choice: "cpu", or this rank's GPU
    try:
        backend.install(link, rank, world_size, device=device)
    except BaseException as exc:  # noqa: BLE001
        _error(link, "setup", None, exc)
    code = Path(spec["code"])
    sys.meta_path.insert(0, _Forbidden(list(spec.get("forbidden", []))))
    sys.path.insert(0, str(code))
    try:
        lab = load_module(code / "_lab_harness.py", "_lab_harness")
        student = load_module(code / f"{spec['module']}.py", spec["module"])
    except BaseException as exc:  # noqa: BLE001
        _error(link, "import", None, exc)
    link.send({"k": "ready"})
    while True:
        meta, payload = link.inbox.get()
        if meta.get("k") != "case":
            _leave(0)
        index = int(meta["case"])
        try:
            call = Call(rank, world_size, dict(meta["params"]), unpack(meta["inputs"], payload),
                        device=device, _link=link)
            out = lab.CALLS[meta["call"]](student, call)
            tree, data = pack(out)
        except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt too
            _error(link, "case", index, exc)
        link.send({"k": "output", "case": index, "tree": tree}, data)


__all__ = ["load_module", "main"]
