"""The rank side of `spawn`: set the process up, join the group, run fn, send the outcome back.

The same `run_rank` runs in a forked child (fork start method) and in a fresh interpreter
(spawn start method, entered through `main`). It never returns: it ends the process with
`os._exit` right after the outcome is written, which avoids the SIGABRT that torch can raise in
interpreter shutdown ("terminate called without an active exception") and any atexit handler a
forked child would otherwise inherit from a notebook kernel.

The outcome travels over a plain pipe as length-prefixed frames, written synchronously: a
`multiprocessing.Queue` writes from a feeder thread and can lose the last message at `os._exit`.
"""

from __future__ import annotations

import ctypes
import datetime
import faulthandler
import io
import os
import random
import signal
import struct
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, NoReturn

from .. import comm
from .context import Placement, RankContext, rank_device, set_context
from .outcome import RankFailure, RankOutcome

_HEADER = struct.Struct("<Q")  # frame length in bytes


@dataclass
class RankSpec:
    """Everything a rank needs to know, sent from the parent (plain data, picklable)."""

    rank: int
    world_size: int
    backend: str
    pg_timeout: float
    """Seconds before a collective gives up inside the rank (the parent's timeout comes first)."""
    record: bool
    max_events: int
    values: int
    """Keep the elements of sends up to this many elements (`toolkit.comm.recording(values=)`)."""
    workdir: str
    """The launch's private temporary folder (in-flight board, stack dumps, payload)."""
    seed: int | None
    threads: int
    env: dict[str, str] = field(default_factory=dict)
    """Set in the rank before anything else runs (a CPU rank's hidden GPUs among them)."""
    parent_pid: int = 0
    placement: str = "cpu"
    """`toolkit.launch.context.Placement.kind`: cpu, gpu (one per rank) or shared."""
    gpus: int = 0
    """GPUs the ranks use (shared: rank r on cuda:(r mod gpus))."""

    @property
    def board_path(self) -> str:
        return board_path(self.workdir)

    @property
    def stack_path(self) -> str:
        """File where faulthandler writes this rank's stack when the parent asks (SIGUSR1)."""
        return stack_path(self.workdir, self.rank)


def board_path(workdir: str) -> str:
    return os.path.join(workdir, "inflight.bin")


def stack_path(workdir: str, rank: int) -> str:
    return os.path.join(workdir, f"stack-{rank}.txt")


def write_frame(fd: int, payload: bytes) -> None:
    view = memoryview(_HEADER.pack(len(payload)) + payload)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def read_frames(buf: bytearray) -> list[bytes]:
    """Complete frames at the front of `buf` (removed from it)."""
    frames = []
    while len(buf) >= _HEADER.size:
        (n,) = _HEADER.unpack_from(buf)
        if len(buf) < _HEADER.size + n:
            break
        frames.append(bytes(buf[_HEADER.size:_HEADER.size + n]))
        del buf[:_HEADER.size + n]
    return frames


def store_for(workdir: str, world_size: int) -> Any:
    import torch.distributed as dist

    return dist.FileStore(os.path.join(workdir, "rendezvous"), world_size)


def _identity(x: Any) -> Any:
    return x


def dumps(obj: Any) -> bytes:
    """cloudpickle, with CUDA tensors moved to the CPU (unpickling them would put CUDA in the
    parent, after which forking is unsafe)."""
    import cloudpickle
    import torch

    class _Pickler(cloudpickle.Pickler):
        def reducer_override(self, o: Any) -> Any:
            if isinstance(o, torch.Tensor) and o.device.type not in ("cpu", "meta"):
                return _identity, (o.detach().cpu(),)
            return super().reducer_override(o)

    buf = io.BytesIO()
    _Pickler(buf).dump(obj)
    return buf.getvalue()


def _die_with_parent(parent_pid: int) -> None:
    """Linux: get SIGKILL if the parent dies (a killed notebook kernel must not leave ranks)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
        except (OSError, AttributeError):
            pass
    if parent_pid and os.getppid() != parent_pid:  # parent already gone before prctl
        os._exit(1)


def _setup_process(spec: RankSpec) -> None:
    """Signals, stdio, fault handlers, threads, seeds, environment."""
    _die_with_parent(spec.parent_pid)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    # Fresh line-buffered streams on fds 1/2 (in a forked child, sys.stdout is still the
    # notebook kernel's object, which must not be used from here).
    sys.stdin = open(0, "r", closefd=False)
    text = dict(buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
    sys.stdout = open(1, "w", **text)
    sys.stderr = open(2, "w", **text)
    faulthandler.enable(file=sys.stderr)  # a segfault prints the Python stack to stderr
    # faulthandler holds its own reference to the file: it stays open for the rank's life.
    faulthandler.register(signal.SIGUSR1, file=open(spec.stack_path, "w"), all_threads=True)

    local = {"RANK": spec.rank, "WORLD_SIZE": spec.world_size, "LOCAL_RANK": spec.rank,
             "LOCAL_WORLD_SIZE": spec.world_size}
    os.environ.update({k: str(v) for k, v in local.items()})
    os.environ.update(spec.env)

    import torch

    # One thread per rank by default: ranks share few cores, and in a forked child torch's
    # OpenMP pool inherited from a parent that used it can hang (libgomp is not fork-safe).
    torch.set_num_threads(spec.threads)
    if spec.seed is not None:
        random.seed(spec.seed + spec.rank)
        torch.manual_seed(spec.seed + spec.rank)
        try:
            import numpy as np
            np.random.seed((spec.seed + spec.rank) % 2**32)
        except ImportError:
            pass


def _init_group(spec: RankSpec) -> None:
    import torch.distributed as dist

    board = comm.InflightBoard(spec.board_path, spec.world_size)
    comm.attach(spec.rank, board)
    placement = Placement(spec.backend, spec.placement, spec.gpus)
    dev = rank_device(placement, spec.rank)
    timeout = datetime.timedelta(seconds=spec.pg_timeout)
    # A FileStore in the launch's private folder, not a TCPStore: no port to pick or collide
    # on. On this kind of machine a TCPStore client connect stalled for exactly 5 s (a name
    # resolver's timeout) in 5 of 60 launches; with a FileStore, 0 of 100. The max column of
    # benchmarks/launch_overhead.py shows such stalls when they happen.
    store = store_for(spec.workdir, spec.world_size)
    kwargs: dict[str, Any] = {}
    if spec.backend == "nccl":
        kwargs["device_id"] = dev
    dist.init_process_group(spec.backend, store=store, rank=spec.rank,
                            world_size=spec.world_size, timeout=timeout, **kwargs)
    # Every rank finishes joining before any runs fn. Without this a rank whose fn makes no
    # call can return and exit while a peer is still completing gloo's connection set-up,
    # and that peer fails to join with "Connection closed by peer" (seen in about 1 launch in
    # 5 on a loaded 2-core machine). The unwrapped barrier: set-up, not the rank's traffic.
    comm.original("barrier")()
    set_context(RankContext(spec.rank, spec.world_size, spec.rank, spec.world_size,
                            spec.backend, dev, spec.placement))


def _error_frame(kind: str, exc: BaseException, trace: Any) -> bytes:
    tb = exc.__traceback__
    if kind == "exception" and tb is not None and tb.tb_next is not None:
        tb = tb.tb_next  # drop run_rank's own frame: the rank's traceback starts in fn
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    try:
        exc_bytes: bytes | None = dumps(exc)
    except Exception:
        exc_bytes = None
    failure = RankFailure(kind, type(exc).__name__, str(exc), text, exc_bytes)
    return dumps(RankOutcome.error(failure, *_recorded(trace)).to_plain())


def _recorded(trace: Any) -> tuple[list[tuple], int]:
    """(events as plain tuples, how many were dropped) of the rank's trace (None: none)."""
    if trace is None:
        return [], 0
    return [e.as_tuple() for e in trace.events], trace.dropped


def run_rank(spec: RankSpec, fn: Callable[..., Any], args: tuple, result_fd: int) -> NoReturn:
    """Run ``fn(rank, world_size, *args)`` as rank `spec.rank`; never returns."""
    code = 1
    try:
        _setup_process(spec)
        comm.install()  # before fn runs: every call it makes goes through the recorder
        trace = comm.Trace()
        if spec.record:
            comm.start_recording(trace, spec.max_events, spec.values)
        try:
            _init_group(spec)
        except BaseException as exc:  # noqa: BLE001 - any failure must reach the parent
            write_frame(result_fd, _error_frame("init", exc, trace))
        else:
            try:
                result = fn(spec.rank, spec.world_size, *args)
            except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt too
                write_frame(result_fd, _error_frame("exception", exc, trace))
            else:
                try:
                    payload = dumps(RankOutcome.ok(result, *_recorded(trace)).to_plain())
                except Exception as exc:  # noqa: BLE001
                    write_frame(result_fd, _error_frame("result", exc, trace))
                else:
                    write_frame(result_fd, payload)
                    code = 0
        os.close(result_fd)
        for f in (sys.stdout, sys.stderr):
            f.flush()
        _teardown()
    except BaseException:  # noqa: BLE001 - last resort: say something on stderr
        try:
            os.write(2, traceback.format_exc().encode(errors="replace"))
        except OSError:
            pass
    finally:
        os._exit(code)


def _teardown() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - the outcome is already sent
            pass


def main(argv: list[str]) -> NoReturn:
    """Entry point of a rank started as a fresh interpreter (spawn start method).

    argv: payload file, rank, result fd. The payload holds the common spec, the function and
    its arguments, pickled by value with cloudpickle so functions from notebooks and
    ``__main__`` arrive intact.
    """
    payload_path, rank, result_fd = argv[0], int(argv[1]), int(argv[2])
    try:
        import cloudpickle

        with open(payload_path, "rb") as f:
            parent_path, spec, blob = cloudpickle.load(f)
        for p in parent_path:
            if p not in sys.path:
                sys.path.append(p)
        fn, args = cloudpickle.loads(blob)
        spec.rank = rank
    except BaseException as exc:  # noqa: BLE001
        write_frame(result_fd, _error_frame("init", exc, None))
        os._exit(1)
    run_rank(spec, fn, args, result_fd)
