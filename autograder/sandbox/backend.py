"""The ranks' only process group: every torch.distributed call becomes a frame to the courier.

A rank has no gloo group, no socket and no store shared with other ranks. `install(link, rank,
world_size)` registers the ``"courier"`` backend (``torch.distributed.Backend.register_backend``
with a Python `ProcessGroup` subclass, torch ≥ 2.1) and initialises the default group on it.
Point-to-point calls and collectives reach `CourierGroup`'s methods (torch 2.13 routes
``reduce_scatter_tensor`` / ``all_gather_into_tensor`` to ``reduce_scatter_single`` /
``all_gather_single``); each sends one ``op`` frame (what, with whom, the input bytes) and
returns a `CourierWork` at once. The courier (`autograder.sandbox.courier`, in the grader)
moves the bytes, computes the collectives the lab allows, and answers ``done`` (with the output
bytes) or ``fail``; the link's reader thread copies the answer into the output tensors and
completes the work, like a real backend finishing in the background.

A tensor of a dtype the channel does not carry (`channel.DTYPES`: no float8, no uint16-64) is
refused here, in the rank, with a TypeError of the call that names it; a receive from any rank
(``dist.recv(buf)`` without ``src``) returns the sender the courier named (`_source_rank`).

Nothing here is trusted: a submission can call these methods with anything, replace them, or
write frames of its own. The courier checks every frame and keeps its own record.

Devices: tensors are staged through host memory (`channel.tensor_bytes` copies a CUDA tensor
to the CPU before encoding; the reply is ``copy_``'d back onto the tensor's device), so the
same backend carries CUDA tensors. A cuda grade's rank (``device="cuda:k"``, k = rank mod the
grade's GPUs: `autograder.devices.rank_device`) registers the backend for "cuda" too and makes
its GPU the current device, so ``.cuda()`` and ``device="cuda"`` in a submission land on that
rank's GPU, not on GPU 0 with every other rank.
"""

from __future__ import annotations

import datetime
import itertools
import os
import queue
import socket
import sys
import threading
from typing import Any

import torch
import torch.distributed as dist

from .channel import DTYPES, dtype_name, make_tensor, recv_frame, send_frame, tensor_bytes

DEVICES = ("cpu",)
_REDUCE = {"SUM": "sum", "AVG": "avg", "PRODUCT": "product", "MIN": "min", "MAX": "max",
           "BAND": "band", "BOR": "bor", "BXOR": "bxor", "PREMUL_SUM": "premul_sum"}


def _reduce_name(opts: Any) -> str:
    op = getattr(opts, "reduceOp", None)
    for name, label in _REDUCE.items():
        try:
            if op == getattr(dist.ReduceOp, name):
                return label
        except Exception:  # noqa: BLE001 - an odd object from a direct call
            pass
    return "sum" if op is None else "unknown"


class Link:
    """This rank's end of its channel: frames out (one writer at a time), and a reader thread
    that completes works and queues the grader's case frames and gate answers."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.lock = threading.Lock()
        self.works: dict[int, "CourierWork"] = {}
        self.ids = itertools.count()
        self.inbox: queue.Queue = queue.Queue()
        self.gates: queue.Queue = queue.Queue()
        """The courier's answers to ``gate`` frames (`probe.Call.gate`), in order."""
        self.reader = threading.Thread(target=self._read, name="courier-link", daemon=True)
        self.reader.start()

    def send(self, meta: dict, payload: bytes = b"") -> None:
        with self.lock:
            send_frame(self.sock, meta, payload)

    def _read(self) -> None:
        try:
            while True:
                meta, payload = recv_frame(self.sock)
                kind = meta.get("k")
                if kind in ("done", "fail"):
                    work = self.works.pop(meta.get("id"), None)
                    if work is not None:
                        done = work._finish(meta, payload)
                        work = None  # a rank woken by `done` finds no buffer of its held here
                        done.set()
                elif kind == "gate":
                    self.gates.put(meta)
                else:
                    self.inbox.put((meta, payload))
        except BaseException:  # noqa: BLE001 - the channel closed: the grader ended the launch
            os._exit(0)


class CourierWork(dist._Work):
    """The handle of one call: done when the courier answered and the outputs were written."""

    def __init__(self, link: Link, op_id: int, outputs: list[torch.Tensor]) -> None:
        super().__init__()
        self._link, self._id, self._outputs = link, op_id, outputs
        self._event = threading.Event()
        self._future: torch.futures.Future = torch.futures.Future()
        self._error: str | None = None
        self._seen = False
        self._source = -1

    def _finish(self, meta: dict, payload: bytes) -> threading.Event:
        if meta.get("k") == "fail":
            self._error = str(meta.get("message", "the grader refused this call"))
            self._future.set_exception(RuntimeError(self._error))
        else:
            try:
                for t, (dtype, shape, offset, nbytes) in zip(self._outputs, meta["outputs"]):
                    value = make_tensor(dtype, shape, payload[offset:offset + nbytes])
                    with torch.no_grad():
                        t.copy_(value.reshape(t.shape))
                self._source = int(meta.get("source", -1))
                self._future.set_result(self._outputs)
            except Exception as err:  # noqa: BLE001 - a reply that does not fit the buffers
                self._error = f"the reply did not fit: {err}"
                self._future.set_exception(RuntimeError(self._error))
        return self._event  # set by the reader once it holds no reference to this work

    def _observe(self, kind: str) -> None:
        if kind == "wait":  # where the rank waits: the courier names it in a deadlock
            self._seen = True
            self._link.send({"k": kind, "id": self._id, "stack": _stack(sys._getframe(2))})
        elif not self._seen:
            self._seen = True
            self._link.send({"k": kind, "id": self._id})

    def wait(self, timeout: Any = None) -> bool:
        if not self._event.is_set():
            self._observe("wait")
            self._event.wait()
        else:
            self._observe("seen")
        if self._error is not None:
            raise RuntimeError(self._error)
        return True

    def is_completed(self) -> bool:
        done = self._event.is_set()
        if done:
            self._observe("seen")
        return done

    def is_success(self) -> bool:
        return self._event.is_set() and self._error is None

    def exception(self) -> Any:
        return RuntimeError(self._error) if self._error else None

    def get_future(self) -> torch.futures.Future:
        self._observe("seen")
        return self._future

    def source_rank(self) -> int:
        return self._source

    # torch.distributed.recv without `src` (a receive from any rank) asks `_source_rank()`
    # after the wait; the C++ base would raise, so answer with the sender the courier named.
    _source_rank = source_rank

    def result(self) -> list[torch.Tensor]:
        self.wait()
        return self._outputs


def _stack(frame: Any, depth: int = 12) -> list:
    """[file, line, function] of the innermost `depth` frames from `frame` outwards, without
    reading any source (traceback.extract_stack would open every file)."""
    out = []
    while frame is not None and len(out) < depth:
        out.append([frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name])
        frame = frame.f_back
    return out[::-1]


def _describe(tensors: list[torch.Tensor]) -> tuple[list, bytes]:
    specs, parts, offset = [], [], 0
    for t in tensors:
        raw = tensor_bytes(t)
        specs.append([dtype_name(t), list(t.shape), offset, len(raw)])
        parts.append(raw)
        offset += len(raw)
    return specs, b"".join(parts)


def _check_dtypes(op: str, tensors: list[torch.Tensor]) -> None:
    """Refuse, in the rank, a tensor whose dtype the channel does not carry (float8, uint16-64,
    ...): an ordinary TypeError of this call, before any frame is sent (the courier would take
    the frame for a forged one)."""
    for t in tensors:
        if dtype_name(t) not in DTYPES:
            raise TypeError(f"{op} on a {dtype_name(t)} tensor: the grader's process group "
                            f"carries only {', '.join(DTYPES)} (cast the tensor to one of "
                            f"them, e.g. .to(torch.bfloat16), and back after)")


def _tensors(value: Any) -> list[torch.Tensor]:
    """A flat list of the tensors in a tensor, a list, or a list of lists."""
    if isinstance(value, torch.Tensor):
        return [value]
    out: list[torch.Tensor] = []
    for v in value or []:
        out += _tensors(v)
    return out


class CourierGroup(dist.ProcessGroup):
    """A process group whose every operation goes through the courier."""

    def __init__(self, link: Link, rank: int, size: int, members: list[int]) -> None:
        super().__init__(rank, size)
        self._link, self._members = link, list(members)

    def getBackendName(self) -> str:
        return "courier"

    def _global(self, group_rank: Any) -> int:
        return self._members[int(group_rank)] if 0 <= int(group_rank) < len(self._members) else -1

    def _call(self, op: str, *, send: Any = (), outputs: Any = (), opts: Any = None,
              peer: int | None = None, tag: int = 0, root: bool = False) -> CourierWork:
        ins, outs = _tensors(send), _tensors(outputs)
        _check_dtypes(op, ins + outs)
        inputs, payload = _describe(ins)
        op_id = next(self._link.ids)
        work = CourierWork(self._link, op_id, outs)
        meta = {"k": "op", "id": op_id, "op": op, "group": self._members, "tag": int(tag),
                "async": bool(getattr(opts, "asyncOp", False)), "inputs": inputs,
                "outputs": [[dtype_name(t), list(t.shape)] for t in outs]}
        if peer is not None:
            meta["peer"] = peer
        if root:
            meta["root"] = self._global(getattr(opts, "rootRank", 0))
        if hasattr(opts, "reduceOp"):
            meta["reduce"] = _reduce_name(opts)
        self._link.works[op_id] = work
        self._link.send(meta, payload)
        return work

    # -- point-to-point ----------------------------------------------------------------------
    def send(self, tensors, dst, tag=0):
        return self._call("send", send=tensors, peer=self._global(dst), tag=tag)

    def recv(self, tensors, src, tag=0):
        return self._call("recv", outputs=tensors, peer=self._global(src), tag=tag)

    def recv_anysource(self, tensors, tag=0):
        return self._call("recv", outputs=tensors, peer=-1, tag=tag)

    # -- collectives ---------------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        return self._call("all_reduce", send=tensors, outputs=tensors, opts=opts)

    def allreduce_coalesced(self, tensors, opts=None):
        return self._call("all_reduce", send=tensors, outputs=tensors, opts=opts)

    def broadcast(self, tensors, opts=None):
        return self._call("broadcast", send=tensors, outputs=tensors, opts=opts, root=True)

    def reduce(self, tensors, opts=None):
        return self._call("reduce", send=tensors, outputs=tensors, opts=opts, root=True)

    def barrier(self, opts=None):
        return self._call("barrier", opts=opts)

    def monitored_barrier(self, opts=None, *args):
        return self._call("barrier", opts=opts)

    def allgather(self, output_tensors, input_tensors, opts=None):
        return self._call("all_gather", send=input_tensors, outputs=output_tensors, opts=opts)

    def all_gather_single(self, output, input, opts=None):
        return self._call("all_gather_single", send=input, outputs=output, opts=opts)

    def _allgather_base(self, output, input, opts=None):
        return self._call("all_gather_single", send=input, outputs=output, opts=opts)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        return self._call("reduce_scatter", send=input_tensors, outputs=output_tensors, opts=opts)

    def reduce_scatter_single(self, output, input, opts=None):
        return self._call("reduce_scatter_single", send=input, outputs=output, opts=opts)

    def _reduce_scatter_base(self, output, input, opts=None):
        return self._call("reduce_scatter_single", send=input, outputs=output, opts=opts)

    def gather(self, output_tensors, input_tensors, opts=None):
        return self._call("gather", send=input_tensors, outputs=output_tensors, opts=opts,
                          root=True)

    def scatter(self, output_tensors, input_tensors, opts=None):
        return self._call("scatter", send=input_tensors, outputs=output_tensors, opts=opts,
                          root=True)

    def alltoall(self, output_tensors, input_tensors, opts=None):
        return self._call("alltoall", send=input_tensors, outputs=output_tensors, opts=opts)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        return self._call("alltoall_base", send=input, outputs=output, opts=opts)


def install(link: Link, rank: int, world_size: int, timeout_s: float = 600.0, *,
            device: str = "cpu") -> None:
    """Register the courier backend (for CUDA tensors too when `device` is a GPU, ``"cuda:k"``:
    they are staged through host memory; that GPU becomes the current device) and make it this
    rank's default process group."""
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(torch.device(device))

    def create(opts: Any, _pg_options: Any) -> CourierGroup:
        members = list(opts.global_ranks_in_group) or list(range(world_size))
        return CourierGroup(link, opts.group_rank, opts.group_size, members)

    devices = [*DEVICES, "cuda"] if cuda else list(DEVICES)
    dist.Backend.register_backend("courier", create, extended_api=True, devices=devices)
    dist.init_process_group("courier", store=dist.HashStore(), rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))


__all__ = ["CourierGroup", "CourierWork", "DEVICES", "Link", "install"]
