"""`spawn`'s arguments checked before anything starts, and its start method chosen.

Each refusal names the argument, what was expected and what to do; the start method is fork
only while the CUDA driver is untouched in this process (`gpus.driver_live`: a child forked
after it started cannot use CUDA), never with NCCL, and only where fork exists. Importing this
module changes nothing.
"""

from __future__ import annotations

import inspect
import os
import sys
from typing import Any

from . import gpus

START_METHODS = ("auto", "fork", "spawn")


def check_arguments(fn: Any, world_size: Any, args: tuple, timeout: Any, seed: Any,
                     threads: Any, env: Any) -> None:
    if not callable(fn):
        raise TypeError(
            f"spawn(fn, world_size, ...) needs a function fn(rank, world_size, *args) as its first "
            f"argument; got {fn!r} of type {type(fn).__name__}")
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"spawn(world_size=...) must be an int, got {world_size!r}")
    if world_size < 1:
        raise ValueError(f"spawn(world_size=...) must be at least 1, got {world_size}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"spawn(timeout=...) must be a positive number of seconds, "
                         f"got {timeout!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"spawn(seed=...) must be an int or None, got {seed!r}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or threads < 1):
        raise ValueError(f"spawn(threads=...) must be a positive int or None, got {threads!r}")
    if env is not None and not all(isinstance(k, str) and isinstance(v, str)
                                   for k, v in dict(env).items()):
        raise TypeError("spawn(env=...) must map str to str, "
                        "e.g. {'TORCH_DISTRIBUTED_DEBUG': 'DETAIL'}")
    try:
        inspect.signature(fn).bind(0, world_size, *args)
    except TypeError as exc:
        name = getattr(fn, "__qualname__", repr(fn))
        raise TypeError(
            f"spawn calls fn(rank, world_size, *args), i.e. {name} with {2 + len(args)} positional "
            f"arguments, but {name}{inspect.signature(fn)} does not accept that: {exc}") from None
    except ValueError:
        pass  # no signature available (some builtins): let the rank find out


def choose_start_method(start_method: str, backend: str) -> str:
    if start_method not in START_METHODS:
        raise ValueError(f"spawn(start_method={start_method!r}): use one of "
                         f"{', '.join(map(repr, START_METHODS))}")
    cuda_live = gpus.driver_live()  # however it happened: is_available(), a backward, a tensor
    if start_method == "fork":
        if backend == "nccl" or cuda_live:
            raise ValueError(
                "spawn(start_method='fork') is unsafe with CUDA (the NCCL backend, or the CUDA "
                "driver already initialised in this process, e.g. by torch.cuda.is_available() "
                "or a backward pass on a machine with GPUs): use start_method='spawn' or 'auto'")
        if not hasattr(os, "fork"):
            raise ValueError("this platform has no fork(); use start_method='spawn' or 'auto'")
        return "fork"
    if start_method == "spawn":
        return "spawn"
    if sys.platform.startswith("linux") and backend == "gloo" and not cuda_live:
        return "fork"
    return "spawn"


__all__ = ["START_METHODS", "check_arguments", "choose_start_method"]
