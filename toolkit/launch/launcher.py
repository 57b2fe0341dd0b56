"""`spawn`: start N ranks on this host, run a function on each, return what each returned.

The parent side of a launch. Choices, and why:

* **Start method.** ``fork`` (Linux, gloo): a child is a copy of the caller, so a function
  defined in a notebook cell just works and 4 ranks start in about 0.1 s (importing torch in a
  fresh interpreter costs ~1.5 s per rank on 2 cores). A child forked after this process
  initialised the CUDA driver cannot use CUDA, nor run a backward pass once autograd has
  started its GPU threads, so fork is chosen only while `gpus.driver_live()` says the driver is
  untouched here (whoever might have touched it: a cell, a library, a backward pass), and
  counting GPUs never touches it (`toolkit.launch.gpus`). Otherwise, for NCCL and on
  non-Linux hosts, ``spawn``: fresh interpreters that receive the function pickled *by value*
  (cloudpickle), which also works for functions defined in ``__main__`` or a notebook.
* **Placement.** `context.resolve_placement`: gloo on the CPU, NCCL with a GPU per rank, or
  gloo with the ranks sharing fewer GPUs (``device="cuda"``). CPU ranks get every GPU hidden
  (`gpus.hidden_cuda_env`): nothing they run reaches a GPU.
* **Rendezvous.** Through a `FileStore` in the launch's own temporary folder: there is no
  rendezvous port to pick, so launches running at the same time never collide (gloo's own
  sockets get ports from the OS). A TCPStore client stalled 5 s in ~8 % of launches here.
* **Supervision.** One loop on the caller's thread reads every rank's stdout, stderr and
  result pipe. The first failure stops all ranks at once; a hang stops them at the timeout and
  says where each one was (in-flight board + a Python stack dump via faulthandler/SIGUSR1).
* **Cleanup.** Each rank leads its own process group; at the end every group, and every
  descendant found, gets SIGKILL and every rank is reaped, whatever happened.
"""

from __future__ import annotations

import gc
import os
import selectors
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from typing import Any, Callable

from .. import comm
from . import gpus, safe_pickle, worker
from .context import Placement, resolve_placement
from .diagnose import failure_error, is_cause, timeout_error
from .outcome import RankFailure, RankOutcome
from .output import OutputPump
from .rankproc import RankProcess, stop_all
from .spawn_arguments import check_arguments, choose_start_method
from .worker import RankSpec, read_frames

DEFAULT_TIMEOUT = 120.0
"""Seconds a whole launch may take by default (start-up included)."""

_SETTLE = 1.0  # s to wait for the real cause after a knock-on error arrives first
_DRAIN = 0.25  # s at most spent draining ready pipes in one go
_PKG_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Forks and the closing of the parent's pipe ends happen under this lock, so that a launch
# running on another thread cannot fork a copy of our pipes' write ends (no EOF otherwise).
_FORK_LOCK = threading.Lock()


def spawn(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str = "auto",
    device: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    start_method: str = "auto",
    seed: int | None = 0,
    threads: int | None = None,
    echo: bool = True,
    env: dict[str, str] | None = None,
    trusted: bool = True,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on `world_size` new processes; return their results.

    Each rank starts with the default process group initialised (``dist.get_rank()`` works) and
    its device chosen (`toolkit.launch.device()`); the group is torn down after `fn` returns.
    What ranks print appears here, each line prefixed ``[rank N]``.

    Args:
        fn: the worker; may be defined in a notebook cell or ``__main__``.
        world_size: number of ranks (>= 1).
        *args: extra arguments for every rank.
        backend: ``"auto"`` (NCCL with one GPU per rank when there are enough GPUs, else gloo
            on CPU), ``"gloo"`` or ``"nccl"``.
        device: ``"auto"`` (what ``backend="auto"`` says above), ``"cpu"`` or ``"cuda"``: the
            GPUs there are, one per rank on NCCL when there are enough, else shared by the
            ranks on gloo (rank r on ``cuda:(r mod G)``). None (the default) reads
            ``$TOOLKIT_DEVICE`` (`toolkit.launch.context.default_device`), else ``"auto"``.
        timeout: seconds for the whole launch; past it every rank is stopped and
            `SpawnTimeout` says which ranks were still running and where.
        start_method: ``"auto"`` (fork on Linux for gloo while this process's CUDA driver is
            untouched, else spawn), ``"fork"`` or ``"spawn"``.
        seed: each rank seeds `random`, numpy and torch with ``seed + rank``; None leaves the
            generators as they are (a forked rank then copies the caller's state).
        threads: torch intra-op threads per rank; default 1 with fork, else cores / world_size.
        echo: show what ranks print (capped at 1 MB per rank); False keeps it for errors only.
        env: extra environment variables for the ranks (e.g. ``TORCH_DISTRIBUTED_DEBUG``);
            CPU ranks see no GPU whatever it says.
        trusted: False when the ranks run code you do not trust (the autograder): what they
            send back is decoded as plain data only (`toolkit.launch.safe_pickle`), so a rank
            cannot make this process run anything, and a rank's exception is not rebuilt
            (`RankError.exception` is None; type, message and traceback stay text).

    Returns:
        The return values in rank order. CUDA tensors come back on the CPU.

    Raises:
        RankError: a rank raised, died or returned something that cannot be pickled; the
            message carries its rank and traceback, and the other ranks were stopped.
        SpawnTimeout: the launch outlived `timeout`.
        ValueError / TypeError: bad arguments, before any process starts.

    Inside a `toolkit.comm.recording()` block every rank records its communication and the
    block's trace receives all of it when the launch returns.
    """
    check_arguments(fn, world_size, args, timeout, seed, threads, env)
    placement = resolve_placement(backend, device, world_size)
    method = choose_start_method(start_method, placement.backend)
    traces = comm.active_traces()
    if threads is None:
        threads = 1 if method == "fork" else max(1, (os.cpu_count() or 1) // world_size)
    launch = _Launch(fn, args, world_size, placement, method, float(timeout), echo, trusted)
    rank_env = dict(env or {})
    if placement.kind == "cpu":
        rank_env.update(gpus.hidden_cuda_env())
    try:
        return launch.run(record=bool(traces), max_events=comm.patch.recording_cap(),
                          values=comm.patch.recording_values(), seed=seed, threads=threads,
                          env=rank_env)
    finally:
        # Also after a failure: what the ranks that reported had recorded is worth drawing.
        comm.patch.deliver(launch.events(), launch.dropped(), traces)


class _Launch:
    def __init__(self, fn: Callable, args: tuple, world_size: int, placement: Placement,
                 method: str, timeout: float, echo: bool, trusted: bool = True) -> None:
        self.fn, self.args, self.world_size = fn, args, world_size
        self.trusted, self.placement = trusted, placement
        self.backend, self.method, self.timeout = placement.backend, method, timeout
        self.pump = OutputPump(world_size, echo=echo)
        self.ranks: list[RankProcess] = []

    # -- the launch as a whole ---------------------------------------------------------------
    def run(self, *, record: bool, max_events: int, values: int, seed: int | None, threads: int,
            env: dict[str, str]) -> list[Any]:
        blob = None
        if self.method == "spawn":
            blob = _pickle_work(self.fn, self.args)
        deadline = time.monotonic() + self.timeout
        workdir = tempfile.mkdtemp(prefix="toolkit-launch-")
        board = self.board = comm.InflightBoard(worker.board_path(workdir), self.world_size,
                                                create=True)
        try:
            spec = RankSpec(rank=0, world_size=self.world_size, backend=self.backend,
                            pg_timeout=self.timeout + 15, record=record, max_events=max_events,
                            values=values,
                            workdir=workdir, seed=seed, threads=threads, env=env,
                            parent_pid=os.getpid(), placement=self.placement.kind,
                            gpus=self.placement.gpus)
            try:
                self._start_all(spec, blob, workdir)
                self._supervise(deadline, board)
            finally:
                stop_all(self.ranks)
                self.pump.flush()
            return self._results()  # reads the board to tell causes from knock-on failures
        finally:
            board.close()
            shutil.rmtree(workdir, ignore_errors=True)

    def _results(self) -> list[Any]:
        failed = [r for r in self.ranks if r.outcome is None or r.outcome.kind != "ok"]
        if failed:
            raise failure_error(self.ranks, self.world_size, self.board, self.pump,
                                rebuild=self.trusted)
        return [r.outcome.value for r in self.ranks]

    def events(self) -> list[comm.Event]:
        """Every event the ranks sent back (ranks that returned or raised; not hung or dead)."""
        return [comm.Event.from_tuple(t) for r in self.ranks if r.outcome
                for t in r.outcome.events]

    def dropped(self) -> int:
        """Events the ranks that reported could not keep (over the recording's cap)."""
        return sum(r.outcome.dropped for r in self.ranks if r.outcome)

    # -- starting ------------------------------------------------------------------------------
    def _start_all(self, spec: RankSpec, blob: bytes | None, workdir: str) -> None:
        payload = None
        if blob is not None:
            import cloudpickle

            payload = os.path.join(workdir, "payload.pkl")
            with open(payload, "wb") as f:
                cloudpickle.dump(([p for p in sys.path if p], spec, blob), f)
        for rank in range(self.world_size):
            if payload is None:
                self.ranks.append(self._fork(replace(spec, rank=rank)))
            else:
                self.ranks.append(self._popen(rank, payload, spec.env))

    def _fork(self, spec: RankSpec) -> RankProcess:
        for f in (sys.stdout, sys.stderr):  # or the child would print the parent's buffer again
            try:
                f.flush()
            except (OSError, ValueError):
                pass
        with _FORK_LOCK:
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            res_r, res_w = os.pipe()
            # Freeze the caller's objects so the rank's garbage collector never finalises them:
            # destructors of a copied TCPStore or process group crash in a forked child.
            was_frozen = gc.get_freeze_count() > 0
            gc.freeze()
            pid = os.fork()
            if pid != 0 and not was_frozen:
                gc.unfreeze()
            if pid == 0:  # the rank; never returns into the caller's code
                try:
                    os.setpgid(0, 0)
                    os.dup2(out_w, 1)
                    os.dup2(err_w, 2)
                    for fd in (out_r, err_r, res_r, out_w, err_w):
                        os.close(fd)
                    worker.run_rank(spec, self.fn, self.args, res_w)
                finally:
                    os._exit(1)
            for fd in (out_w, err_w, res_w):
                os.close(fd)
        try:
            os.setpgid(pid, pid)  # also from here, so the group exists whoever runs first
        except OSError:
            pass
        return RankProcess(spec.rank, pid, {"out": out_r, "err": err_r, "res": res_r})

    def _popen(self, rank: int, payload: str, rank_env: dict[str, str]) -> RankProcess:
        env = {**os.environ, **rank_env}  # from the start: before the child imports anything
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PKG_ROOT, env.get("PYTHONPATH")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        code = "import sys; from toolkit.launch.worker import main; main(sys.argv[1:])"
        group = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
        with _FORK_LOCK:
            res_r, res_w = os.pipe()
            try:
                p = subprocess.Popen(
                    [sys.executable, "-c", code, payload, str(rank), str(res_w)],
                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    pass_fds=(res_w,), env=env, cwd=os.getcwd(), **group)
            finally:
                os.close(res_w)
        fds = {"out": p.stdout.fileno(), "err": p.stderr.fileno(), "res": res_r}
        return RankProcess(rank, p.pid, fds, popen=p)

    # -- watching ------------------------------------------------------------------------------
    def _supervise(self, deadline: float, board: comm.InflightBoard) -> None:
        sel = selectors.DefaultSelector()
        for r in self.ranks:
            for stream, fd in r.fds.items():
                sel.register(fd, selectors.EVENT_READ, (r, stream))
        first_knock_on: float | None = None
        try:
            while any(r.outcome is None for r in self.ranks):
                now = time.monotonic()
                if now >= deadline:
                    self._read_ready(sel, 0)
                    raise timeout_error(self.ranks, self.world_size, self.timeout, board)
                self._read_ready(sel, min(0.05, deadline - now))
                self._check_exits(sel)
                failures = [r for r in self.ranks if r.outcome and r.outcome.kind != "ok"]
                if any(is_cause(r, board) for r in failures):
                    break
                if failures:
                    first_knock_on = first_knock_on or time.monotonic()
                    if time.monotonic() - first_knock_on > _SETTLE:
                        break
            self._read_ready(sel, 0)  # output printed just before a failure
        finally:
            sel.close()

    def _read_ready(self, sel: selectors.BaseSelector, wait: float) -> None:
        """Read what the ranks wrote. ``wait > 0``: one batch, waiting up to `wait` s for it.
        ``wait == 0``: drain what is ready, for at most _DRAIN s (a rank printing without end
        must not keep the loop from its deadline)."""
        stop = time.monotonic() + _DRAIN
        while True:
            ready = sel.select(wait)
            if not ready:
                return
            for key, _ in ready:
                rank, stream = key.data
                try:
                    data = os.read(key.fd, 1 << 16)
                except OSError:
                    data = b""
                if not data:
                    sel.unregister(key.fd)
                    rank.close(stream)
                elif stream == "res":
                    rank.buf += data
                    for frame in read_frames(rank.buf):
                        self._on_frame(rank, frame)
                else:
                    self.pump.feed(rank.rank, stream, data)
            if wait == 0 and time.monotonic() < stop:
                continue
            return

    def _on_frame(self, rank: RankProcess, frame: bytes) -> None:
        import cloudpickle

        try:
            plain = cloudpickle.loads(frame) if self.trusted else safe_pickle.loads(frame)
            outcome = RankOutcome.from_plain(plain)
        except Exception as exc:  # noqa: BLE001 - e.g. a class the parent cannot import
            outcome = RankOutcome.error(RankFailure("result", type(exc).__name__, str(exc)))
        if rank.outcome is None:
            rank.outcome, rank.seen_at = outcome, time.time()

    def _check_exits(self, sel: selectors.BaseSelector) -> None:
        for r in self.ranks:
            if r.outcome is None and r.exit_code() is not None:
                # It wrote its outcome before exiting, if it wrote one: it is in the pipe now.
                self._read_ready(sel, 0)
                if r.outcome is None:
                    r.outcome, r.seen_at = RankOutcome.died(r.exit_code()), time.time()


def _pickle_work(fn: Callable, args: tuple) -> bytes:
    import cloudpickle

    try:
        return cloudpickle.dumps((fn, args))
    except Exception as exc:  # noqa: BLE001
        raise TypeError(
            "spawn(start_method='spawn') sends fn and its arguments to fresh interpreters by "
            f"pickling them (cloudpickle), and that failed: {type(exc).__name__}: {exc}. Pass "
            "plain data (numbers, lists, dicts, CPU tensors) as arguments, or use "
            "start_method='fork' (Linux, CPU).") from exc


