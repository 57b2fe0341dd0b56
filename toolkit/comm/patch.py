"""Thin wrappers around `torch.distributed`'s communication functions, which feed the recorder.

Every call made through the Python API (`dist.send`, `dist.all_reduce`, ..., by toolkit code,
lesson code or a student's lab) passes through one wrapper. The wrapper does nothing but call the
original unless a recording is active (`toolkit.comm.recording()`) or a launcher attached an
in-flight board; then it notes the op, peer, bytes, dtype and times.

Why patch both `torch.distributed` and `torch.distributed.distributed_c10d`: `dist.X` is a copy
of `distributed_c10d.X` made at import, and torch's own helpers (`batch_isend_irecv`,
`all_gather_object`, the `P2POp` check `op in [isend, irecv]`) look names up in
`distributed_c10d`. Patching both keeps them consistent and counts every message once.

Calls nested inside a recorded call (`all_gather_into_tensor` calls `all_gather_single`) are not
recorded again: only the outermost call a user made counts.

`toolkit.comm.post.post_p2p` is an isend/irecv for callers that already checked their group
(the sliced ring): it posts on the process group as torch's function does and records through
the same `_call_recorded` as the wrappers, so the events are the same.

send/recv/isend/irecv of a GPU tensor on a gloo group (ranks sharing GPUs) are staged through
host memory by `toolkit.comm.staging`, whether or not a recording is active; the event still
describes the caller's tensor.

Not seen: traffic that never enters the Python API: torch DDP's C++ reducer, DTensor's
functional collectives, NCCL calls from C++ extensions. Code that did
``from torch.distributed import send`` *before* `install()` ran holds the unwrapped function;
the launcher installs the wrappers in every rank before any user code runs there.

Importing this module changes nothing: `install()` wraps, `uninstall()` unwraps. What the
wrappers record into (the active recordings, the rank, the in-flight board) is one object,
`toolkit.comm.recorder.RECORDER`.
"""

from __future__ import annotations

import functools
import inspect
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from . import staging
from .events import Event, Trace
from .inflight import InflightBoard
from .recorder import RECORDER


@dataclass(frozen=True)
class _Spec:
    """Where a function keeps its payload and its peer or root."""

    payload: str | None
    """Parameter holding the tensor (or list of tensors) this rank passes in."""
    peer: str | None = None
    """Parameter holding the peer or root as a global rank."""
    group_peer: str | None = None
    """Parameter holding the peer or root as a rank within `group` (newer torch)."""
    always_async: bool = False


SPECS: dict[str, _Spec] = {
    "send": _Spec("tensor", "dst", "group_dst"),
    "recv": _Spec("tensor", "src", "group_src"),
    "isend": _Spec("tensor", "dst", "group_dst", always_async=True),
    "irecv": _Spec("tensor", "src", "group_src", always_async=True),
    "broadcast": _Spec("tensor", "src", "group_src"),
    "all_reduce": _Spec("tensor"),
    "all_reduce_coalesced": _Spec("tensors"),
    "reduce": _Spec("tensor", "dst", "group_dst"),
    "all_gather": _Spec("tensor"),
    "all_gather_single": _Spec("input_tensor"),
    "all_gather_into_tensor": _Spec("input_tensor"),
    "all_gather_coalesced": _Spec("input_tensor_list"),
    "gather": _Spec("tensor", "dst", "group_dst"),
    "scatter": _Spec("scatter_list", "src", "group_src"),
    "reduce_scatter": _Spec("input_list"),
    "reduce_scatter_single": _Spec("input"),
    "reduce_scatter_tensor": _Spec("input"),
    "all_to_all_single": _Spec("input"),
    "all_to_all": _Spec("input_tensor_list"),
    "barrier": _Spec(None),
    "monitored_barrier": _Spec(None),
}


def _describe(payload: Any) -> tuple[int, str, tuple[int, ...]]:
    """(bytes, dtype name, shape) of a tensor or a list of tensors."""
    if isinstance(payload, torch.Tensor):
        return (payload.numel() * payload.element_size(),
                str(payload.dtype).removeprefix("torch."), tuple(payload.shape))
    if isinstance(payload, (list, tuple)) and payload:
        tensors = [t for t in payload if isinstance(t, torch.Tensor)]
        if tensors:
            first = tensors[0]
            return (sum(t.numel() * t.element_size() for t in tensors),
                    str(first.dtype).removeprefix("torch."), tuple(first.shape))
    return 0, "", ()


def _group_ranks(group: Any) -> tuple[int, ...] | None:
    if group is None or group is c10d.GroupMember.WORLD:
        return None
    try:
        return tuple(dist.get_process_group_ranks(group))
    except Exception:  # a group this rank is not part of, or a destroyed one
        return None


class RecordedWork:
    """Stands in for the `Work` handle of an async call, so that `wait()` ends its event.

    Anything else is passed to the real handle (`is_completed`, `get_future`, ...).
    """

    __slots__ = ("_work", "_events", "_rank", "_seq", "_op", "_peer", "_nbytes", "_dtype")

    def __init__(self, work: Any, events: list[Event], rank: int, seq: int, op: str,
                 peer: int | None, nbytes: int, dtype: str) -> None:
        self._work, self._events, self._rank, self._seq = work, events, rank, seq
        self._op, self._peer, self._nbytes, self._dtype = op, peer, nbytes, dtype

    def _ended(self) -> None:
        now = time.time()
        for event in self._events:  # each recording's copy of the event
            if event.end is None:
                event.end = now

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        board = RECORDER.board
        if board is not None:
            board.post(self._rank, self._seq, self._op + ".wait", self._peer, self._nbytes,
                       self._dtype)
        try:
            return self._work.wait(*args, **kwargs)
        finally:
            self._ended()
            if board is not None:
                board.done(self._rank)

    def is_completed(self) -> bool:
        done = self._work.is_completed()
        if done:
            self._ended()
        return done

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)

    def __repr__(self) -> str:
        return f"RecordedWork({self._op}, {self._work!r})"


def _call_recorded(name: str, spec: _Spec, call: Callable[[], Any], payload: Any, group: Any,
                   peer: int | None, is_async: bool) -> Any:
    """Run `call` (one call of the torch function `name`) and record it: the one place events
    are made, for the wrappers and for `post.post_p2p` alike. `peer` is a global rank or None."""
    rec, tls = RECORDER, RECORDER.tls
    board = rec.board
    nbytes, dtype, shape = _describe(payload)
    rank = rec.rank if rec.rank is not None else dist.get_rank()
    seq = next(rec.seq)

    offset, values = 0, None
    p2p = name in ("send", "isend", "recv", "irecv")
    if rec.sinks and p2p and isinstance(payload, torch.Tensor):
        offset = payload.storage_offset()
        limit = rec.values_limit
        if limit and name in ("send", "isend") and payload.numel() <= limit and not payload.is_meta:
            # Host numbers, never a tensor: events must come back on the CPU. Read before the
            # send is posted: what it carries. Read after, a receive already pending into the
            # same memory (an in-place all-gather) may have landed there meanwhile.
            values = tuple(payload.detach().reshape(-1).cpu().tolist())

    if board is not None:
        board.post(rank, seq, name, peer, nbytes, dtype)
    start = time.time()
    tls.depth += 1
    try:
        out = call()
    finally:
        tls.depth -= 1
        if board is not None:
            board.done(rank)
    if name == "recv" and peer is None and isinstance(out, int):
        peer = out  # received from any source: torch returns who sent it

    kept: list[Event] = []
    if rec.sinks:
        kept = rec.add(Event(rank, seq, name, peer, nbytes, dtype, shape, start,
                             None if is_async else time.time(), _group_ranks(group),
                             is_async, offset, values))
    if is_async and out is not None:
        return RecordedWork(out, kept, rank, seq, name, peer, nbytes, dtype)
    return out


def _make_wrapper(name: str, orig: Callable, spec: _Spec) -> Callable:
    params = list(inspect.signature(orig).parameters.values())
    index = {p.name: i for i, p in enumerate(params)}
    default = {p.name: (None if p.default is inspect.Parameter.empty else p.default)
               for p in params}
    rec, tls = RECORDER, RECORDER.tls  # looked up once: a hot path
    staged = name in staging.STAGED_OPS

    def arg(args: tuple, kwargs: dict, key: str | None) -> Any:
        if key is None or key not in index:
            return None
        i = index[key]
        return args[i] if i < len(args) else kwargs.get(key, default[key])

    @functools.wraps(orig)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        call = None
        if staged:  # a GPU tensor on gloo goes through host memory (toolkit.comm.staging)
            tensor = args[0] if args else kwargs.get("tensor")
            if staging.wanted(tensor, arg(args, kwargs, "group")):
                call = functools.partial(staging.call, name, orig, tensor, args, kwargs)
        if tls.depth or (rec.board is None and not rec.sinks):  # idle: the cheap path
            return orig(*args, **kwargs) if call is None else call()
        group = arg(args, kwargs, "group")
        peer = arg(args, kwargs, spec.peer)
        if peer is None:
            group_peer = arg(args, kwargs, spec.group_peer)
            if group_peer is not None:
                peer = dist.get_global_rank(group, group_peer) if group is not None else group_peer
        is_async = spec.always_async or bool(arg(args, kwargs, "async_op"))
        return _call_recorded(name, spec, call or (lambda: orig(*args, **kwargs)),
                              arg(args, kwargs, spec.payload), group, peer, is_async)

    wrapper.__toolkit_wrapped__ = True  # type: ignore[attr-defined]
    return wrapper


# -- the module's functions: the recorder's public face ------------------------------------------

def install() -> None:
    """Wrap the communication functions of `torch.distributed` and
    `torch.distributed.distributed_c10d` (idempotent). Importing the toolkit does not: the
    launcher's rank worker, `init_from_env` and `recording()` call it where calls must be
    seen."""
    for name, spec in SPECS.items():
        orig = getattr(c10d, name, None)
        if orig is None or getattr(orig, "__toolkit_wrapped__", False):
            continue
        wrapped = _make_wrapper(name, orig, spec)
        RECORDER.originals[name] = orig
        setattr(c10d, name, wrapped)
        if getattr(dist, name, None) is orig:
            setattr(dist, name, wrapped)


def uninstall() -> None:
    """Put the original functions back."""
    for name, orig in RECORDER.originals.items():
        if getattr(dist, name, None) is getattr(c10d, name, None):
            setattr(dist, name, orig)
        setattr(c10d, name, orig)
    RECORDER.originals.clear()


def is_installed() -> bool:
    return bool(RECORDER.originals)


def original(name: str) -> Callable:
    """The unwrapped `torch.distributed` function `name` (for measuring the wrapper itself)."""
    return RECORDER.originals.get(name) or getattr(c10d, name)


def attach(rank: int, board: InflightBoard | None) -> None:
    """Called by the launcher in a rank: who we are, and where to post in-flight calls."""
    RECORDER.attach(rank, board)


def detach() -> None:
    RECORDER.detach()


def start_recording(trace: Trace, max_events: int, values: int = 0) -> None:
    RECORDER.start(trace, max_events, values)


def stop_recording(trace: Trace) -> None:
    RECORDER.stop(trace)


def active_traces() -> list[Trace]:
    return [s.trace for s in RECORDER.sinks]


def recording_values() -> int:
    """The largest send whose elements an active recording keeps (0: none)."""
    return RECORDER.values_limit


def recording_cap(default: int = 200_000) -> int:
    """The largest number of events an active recording keeps (what a rank should keep)."""
    limit = RECORDER.events_limit
    return default if limit is None else limit


def deliver(events: Iterable[Event], dropped: int = 0,
            traces: Iterable[Trace] | None = None) -> None:
    """Hand what a launch's ranks recorded to the active recordings (`traces`: only those),
    each under its own caps (`Recorder.deliver`)."""
    RECORDER.deliver(events, dropped, traces)
