"""Point-to-point messages of GPU tensors over gloo, staged through pinned host memory.

When ranks share fewer GPUs than there are ranks (`toolkit.launch`'s ``"shared"`` placement:
rank r on ``cuda:(r mod G)``), NCCL cannot run (it refuses two ranks on one GPU: "Duplicate
GPU detected") and gloo carries the messages. gloo's collectives take CUDA tensors; its
send/recv do not (they fail with "writev ... Bad address": gloo's transport writes from the
tensor's address as if it were host memory). So a send or receive of a device tensor on a gloo
group goes through a host buffer:

    send / isend     host <- tensor (the copy waits for the kernels that produced the tensor),
                     then the host buffer is sent;
    recv / irecv     the host buffer is received into, then tensor <- host once the receive
                     has completed: in ``wait()``, ``is_completed()`` or the work's future.

The buffer is pinned (page-locked) for CUDA tensors, which makes both copies DMA transfers;
torch's caching host allocator keeps freed pinned blocks, so repeated messages of one size do
not pay for ``cudaHostAlloc`` again. A non-contiguous tensor is not staged (torch then raises
on it exactly as on the CPU). `toolkit.comm.patch` calls `call` from its wrappers (and
`toolkit.comm.post` falls back to them), so `batch_isend_irecv` and the toolkit's collectives
are staged too, and the recorder describes the caller's tensor: a staged message is recorded
as the same event (bytes, dtype, shape, offset, values) as a direct one.

`forced()` stages CPU tensors as well, which exercises all of this on a machine without a GPU
(tests/test_comm_staging.py). Importing this module changes nothing.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Iterator

import torch
import torch.distributed as dist

STAGED_OPS = ("send", "recv", "isend", "irecv")


class _State:
    """Process-wide: whether CPU tensors are staged too, and how many messages were."""

    def __init__(self) -> None:
        self.forced = 0
        self.count = 0
        self.lock = threading.Lock()


STATE = _State()


@contextmanager
def forced() -> Iterator[None]:
    """Stage CPU tensors too while the block runs (this process): the staging path without a
    GPU."""
    STATE.forced += 1
    try:
        yield
    finally:
        STATE.forced -= 1


def staged_messages() -> int:
    """Messages this process has sent or received through a host buffer so far."""
    return STATE.count


def wanted(tensor: Any, group: Any) -> bool:
    """Whether a send or receive of `tensor` on `group` must go through host memory: a
    contiguous tensor on a device gloo cannot send from, on a gloo group (or any tensor
    while `forced`)."""
    if not isinstance(tensor, torch.Tensor) or tensor.device.type == "meta":
        return False
    if tensor.device.type == "cpu" and not STATE.forced:
        return False  # the common case: one attribute read
    if not tensor.is_contiguous():
        return False
    try:
        return dist.get_backend(group) == "gloo"
    except (RuntimeError, ValueError):  # no group, or one this rank is not in: torch says so
        return False


def _host_like(tensor: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(tensor, device="cpu", pin_memory=tensor.device.type == "cuda",
                            memory_format=torch.contiguous_format)


def _swap(args: tuple, kwargs: dict, host: torch.Tensor) -> tuple[tuple, dict]:
    """The call's arguments with the host buffer in the tensor's place."""
    if args:
        return (host, *args[1:]), kwargs
    return args, {**kwargs, "tensor": host}


class StagedWork:
    """The work handle of a staged isend/irecv: waiting on it (or finding it completed) also
    lands a received buffer on the caller's tensor; the host buffer lives as long as it."""

    __slots__ = ("_work", "_host", "_target", "_landed")

    def __init__(self, work: Any, host: torch.Tensor, target: torch.Tensor | None) -> None:
        self._work, self._host, self._target, self._landed = work, host, target, False

    def _land(self) -> None:
        if self._target is not None and not self._landed:
            self._landed = True
            with torch.no_grad():
                self._target.copy_(self._host)

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        out = self._work.wait(*args, **kwargs)
        self._land()
        return out

    def is_completed(self) -> bool:
        done = self._work.is_completed()
        if done:
            self._land()
        return done

    def get_future(self) -> torch.futures.Future:
        def landed(fut: torch.futures.Future) -> Any:
            self._land()
            return fut.value()

        return self._work.get_future().then(landed)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)

    def __repr__(self) -> str:
        return f"StagedWork({self._work!r})"


def call(name: str, orig: Any, tensor: torch.Tensor, args: tuple, kwargs: dict) -> Any:
    """Run torch's `name` (`orig`, one of `STAGED_OPS`) for `tensor` through a host buffer;
    `args`/`kwargs` are the caller's, with `tensor` first or as ``tensor=``."""
    host = _host_like(tensor)
    if name in ("send", "isend"):
        with torch.no_grad():
            host.copy_(tensor)  # synchronous: the bytes are on the host before gloo reads them
    new_args, new_kwargs = _swap(args, kwargs, host)
    out = orig(*new_args, **new_kwargs)
    with STATE.lock:
        STATE.count += 1
    if name == "recv":
        if not (isinstance(out, int) and out < 0):  # -1: not a member, nothing arrived
            with torch.no_grad():
                tensor.copy_(host)
        return out  # the sender's rank, as torch returns it
    if name == "send" or out is None:  # None: this rank is not in the group
        return out
    return StagedWork(out, host, tensor if name == "irecv" else None)


__all__ = ["STAGED_OPS", "StagedWork", "call", "forced", "staged_messages", "wanted"]
