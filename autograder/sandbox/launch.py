"""One launch: a check's cases at one world size, on fresh ranks, with the courier in between.

The grader makes each rank a socketpair (its channel) and two pipes (stdout, stderr), asks the
fork server for the ranks, and then runs one loop until the launch is over: frames from the
channels go to the courier (`courier_frames.handle`), what the ranks print is counted and its
tail kept, the fork server's exit reports are collected, and every 50 ms the watchdog measures
the launch (memory, tasks, printed bytes, and, without a tmpfs, the ranks' folders). It ends
when every rank has sent every output, or on the first of: a failure the courier saw (mismatch,
a refused frame), an error a rank reported, a rank that vanished, a deadlock, the check's
timeout, the grade's budget, a limit. Then every process of the launch is killed and its
folders removed; what is left is a `GroupRecord`.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import hangs
from ..failures import classify_end
from ..devices import rank_device
from ..protocol import Failure, GroupRecord, RankEnd
from ..sanitize import printable
from .cgroup import PidsGroup
from .channel import FrameError, FrameReader
from .courier import Courier
from .courier_frames import handle
from .files import MAX_ENTRIES
from .limits import MB, Limits, rank_uid
from .plan import Job, LaunchPlan
from .scratch import Scratch
from .server import ForkServer
from .watchdog import LaunchProcesses, over_limits

TAIL = 8000       # bytes of each rank's output kept for messages
DUMP_END = b'sandbox/rank.py", line'  # a rank's main thread always runs in rank.main
POLL_S = 0.05
LIMIT_KINDS = ("memory_limit", "process_limit", "output_limit", "disk_limit", "wall_limit",
               "call_limit", "result_limit")


@dataclass
class Printed:
    total: int = 0
    tail: bytearray = field(default_factory=bytearray)
    watch: bytearray | None = None
    """Also collect everything here (a stack dump being waited for)."""

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        self.tail += data
        del self.tail[:-TAIL]
        if self.watch is not None and len(self.watch) < 1 << 20:
            self.watch += data


class _Launch:
    def __init__(self, server: ForkServer, job: Job, plan: LaunchPlan, limits: Limits, *,
                 scratch: Scratch, group: PidsGroup | None, uid: int | None,
                 theirs: frozenset[int], deadline: float, grade_group: PidsGroup | None) -> None:
        self.server, self.job, self.plan, self.limits = server, job, plan, limits
        self.scratch, self.grade_group = scratch, grade_group
        self.p = p = plan.key.world_size
        self.sel = selectors.DefaultSelector()
        self.socks, self.readers, self.printed = [], [], [[Printed(), Printed()] for _ in range(p)]
        fds, child_ends = [], []
        for rank in range(p):
            mine, theirs_end = socket.socketpair()
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            mine.setblocking(False)
            self.socks.append(mine)
            self.readers.append(FrameReader())
            self.sel.register(mine, selectors.EVENT_READ, ("chan", rank))
            for fd, stream in ((out_r, 0), (err_r, 1)):
                os.set_blocking(fd, False)
                self.sel.register(fd, selectors.EVENT_READ, ("out", rank, stream))
            fds += [theirs_end.fileno(), out_w, err_w]
            child_ends += [theirs_end, out_w, err_w]
        # Each rank's world is built on the launch's folder (`root`, empty) with a tmpfs $HOME
        # of its share of the disk limit; as root each rank has a uid of the grade's block.
        spec = {"world_size": p, "code": str(job.code), "module": job.module,
                "forbidden": job.forbidden, "toolkit": job.toolkit, "limits": asdict(limits),
                "cgroup": str(group.path) if group else None, "unconfined": job.unconfined,
                "landlock": job.landlock, "seccomp": job.seccomp, "gpus": job.gpus,
                "root": str(scratch.path), "home_bytes": scratch.home_bytes,
                "home_inodes": scratch.home_inodes,
                "ranks": [{"rank": r, "home": str(scratch.homes[r]),
                           "uid": None if job.unconfined else rank_uid(uid, r),
                           "device": rank_device(job.device, r, _set_size(job.gpus))}
                          for r in range(p)]}
        try:
            pids = server.fork(spec, fds, deadline)
        finally:
            for end in child_ends:
                end.close() if isinstance(end, socket.socket) else os.close(end)
        self.pids = pids
        self.procs = LaunchProcesses(server=server.pid, ranks=pids, group=group, theirs=theirs)
        self.courier = Courier(p, plan.cases, job.allowed, job.refusal)
        self.refusals = grade_group.refusals() if grade_group else 0
        self.eof: dict[int, float] = {}
        self.total_printed = 0

    # -- i/o ------------------------------------------------------------------------------------
    def pump(self, wait: float) -> None:
        for key, _ in self.sel.select(wait):
            what = key.data
            if what[0] == "out" and self.total_printed > self.limits.output_mb * MB:
                continue  # over the output limit: read no more
            if what[0] == "chan":
                self._channel(key.fileobj, what[1])
            else:
                try:
                    data = os.read(key.fd, 1 << 16)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if data:
                    self.printed[what[1]][what[2]].feed(data)
                    self._count_output(len(data))
                else:
                    self.sel.unregister(key.fd)
                    os.close(key.fd)
        self.flush()
        self.server.poll()

    def _count_output(self, n: int) -> None:
        """The output limit is checked on every read, not every 50 ms: a rank printing without
        end is stopped within one read (64 KiB per stream) of the limit, however busy the
        machine; past it, nothing more is read (a rank then blocks on its full pipe)."""
        self.total_printed += n
        limit = self.limits.output_mb * MB
        if self.total_printed > limit and self.courier.failure is None:
            self.courier.fail("output_limit", f"printed {self.total_printed / MB:,.1f} MiB; the "
                                              f"limit is {self.limits.output_mb:g} MiB")

    def _channel(self, sock: socket.socket, rank: int) -> None:
        try:
            data = sock.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.sel.unregister(sock)
            self.courier.ranks[rank].gone = True
            self.eof[rank] = time.monotonic()
            return
        reader = self.readers[rank]
        reader.feed(data)
        try:
            frames = reader.frames()
        except FrameError as err:
            self.courier.fail("tampering", f"Rank {rank} wrote bytes on its channel that are no "
                              f"frame ({err}): only torch.distributed calls may use it.", rank)
            return
        for meta, payload in frames:
            handle(self.courier, rank, meta, payload)

    def flush(self) -> None:
        for rank, state in enumerate(self.courier.ranks):
            while state.outbox and not state.gone:
                try:
                    sent = self.socks[rank].send(state.outbox[:1 << 20])
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    state.outbox.clear()
                    break
                del state.outbox[:sent]

    # -- ending ---------------------------------------------------------------------------------
    def log(self) -> str:
        text = ""
        for streams in self.printed:
            for stream in streams:
                if stream.tail.strip():
                    text += stream.tail.decode("utf-8", "replace") + "\n"
        return text

    def exit_code(self, rank: int) -> int | None:
        return self.server.exits.get(self.pids[rank])

    def verdict(self, now: float, start: float, deadline: float,
                polls: int | None) -> Failure | None:
        """The failure that ends the launch now, or None to go on (or when it is complete)."""
        c, job = self.courier, self.job
        if c.failure is not None:
            return c.failure
        refused = [o for s in c.ranks for o in s.ops.values() if o.refused]
        if c.ended is not None:
            if refused:
                return self.refused(refused)
            kind, message = classify_end(c.ended, job.module, self.log(), job.sources)
            if kind == "disk_limit":
                message += (f" (the limits are {self.limits.disk_mb:g} MiB and "
                            f"{MAX_ENTRIES:,} files and folders per launch)")
            return Failure(kind, message, c.ended.rank)
        for rank, seen in self.eof.items():
            if c.ranks[rank].finished:
                continue
            code = self.exit_code(rank)
            if code is None and now - seen < 5.0:
                return None  # the fork server's report of its exit is on its way
            end = RankEnd(rank, "exit", exit_code=code)
            kind, message = classify_end(end, job.module, self.log(), job.sources)
            return Failure(kind, message, rank)
        if c.complete:
            return None
        if c.stuck():
            return hangs.deadlock(c, job.module, job.sources)
        if now > deadline:
            return Failure("wall_limit", f"the grade used up its total budget of "
                                         f"{self.limits.wall_s:g} s before this launch ended")
        if now - start > self.plan.timeout:
            return self.timed_out(deadline)
        return self.watch(polls) if polls is not None else None

    def refused(self, ops) -> Failure:
        op = ops[0]
        return Failure("builtin_collective", f"Rank {op.rank} called torch's built-in "
                       f"{op.op}: {op.refused}", op.rank)

    def watch(self, polls: int) -> Failure | None:
        printed = self.total_printed
        usage = self.scratch.usage() if not self.scratch.mounted and polls % 5 == 0 else None
        refused = self.grade_group.refusals() if self.grade_group else 0
        return over_limits(self.procs, self.limits, ranks=self.p, printed=printed, usage=usage,
                           refused_forks=refused > self.refusals)

    def timed_out(self, deadline: float) -> Failure:
        """Ask each busy rank for its stack (faulthandler, SIGUSR1: written by a C handler even
        while Python code spins) and word the timeout with them; waits 5 s at most for the
        dumps, and never past the grade's `deadline`."""
        busy = [s.rank for s in self.courier.ranks
                if not s.blocked and not s.finished and not s.gone]
        dumps = {r: bytearray() for r in busy}
        for r in busy:
            self.printed[r][1].watch = dumps[r]
        self.procs.signal([self.pids[r] for r in busy], signal.SIGUSR1)
        end = min(time.monotonic() + 5.0, deadline)
        # A dump is complete once the main thread's bottom frame (the rank loop) is in it.
        while time.monotonic() < end and not all(DUMP_END in dumps[r] for r in busy):
            self.pump(POLL_S)
        for r in busy:
            self.printed[r][1].watch = None
        text = {r: dumps[r].decode("utf-8", "replace") for r in busy}
        return hangs.timeout(self.courier, text, self.plan.timeout, self.job.module,
                             self.job.sources)


def run_launch(server: ForkServer, job: Job, plan: LaunchPlan, limits: Limits, *,
               workdir: Path, number: int, uid: int | None, grade_group: PidsGroup | None,
               theirs: frozenset[int], deadline: float) -> tuple[GroupRecord, dict]:
    """Run `plan` on fresh ranks; returns its record and how rank 0 was confined."""
    scratch = Scratch(workdir / f"launch-{number}", plan.key.world_size,
                      disk_mb=limits.disk_mb, uid=None if job.unconfined else uid,
                      private=not job.unconfined)
    group = grade_group.child(f"launch-{number}") if grade_group else None
    record = GroupRecord(plan.key)
    launch = None
    try:
        launch = _Launch(server, job, plan, limits, scratch=scratch, group=group, uid=uid,
                         theirs=theirs, deadline=deadline, grade_group=grade_group)
        start, polls, failure = time.monotonic(), 0, None
        watched = start
        while True:
            launch.pump(POLL_S)
            now = time.monotonic()
            due = now - watched >= POLL_S  # measuring processes costs ~1 ms: every 50 ms
            if due:
                watched, polls = now, polls + 1
            failure = launch.verdict(now, start, deadline, polls if due else None)
            if failure is not None or launch.courier.complete:
                break
        record.failure = failure
    finally:  # every step on its own: one that fails must not leave the others undone
        named, tmpfs = [], scratch.mounted
        if launch is not None:
            _quietly(launch.procs.kill)
            _quietly(lambda: _drain(launch))
            _quietly(lambda: _close(launch))
        _quietly(lambda: named.extend(scratch.usage(watch=("results.json",)).named))
        _quietly(scratch.close)
        if group is not None:
            _quietly(group.kill_all)
    c = launch.courier
    if record.failure is None:
        for case in plan.cases:
            record.outputs[case.index] = [s.outputs.get(case.index) for s in c.ranks]
            record.traffic[case.index] = [s.traffic.get(case.index) for s in c.ranks]
    record.printed = sum(s.total for streams in launch.printed for s in streams)
    record.log_tail = printable(launch.log()[-4 * TAIL:])
    record.forged = [f"r{n}" for n in named] if named else []
    confined = dict(c.ranks[0].confined or {}, tmpfs=tmpfs) if c.ranks[0].confined else {}
    return record, confined


def _set_size(gpus: str) -> int | None:
    """GPUs in a grade's set ("0,1" -> 2; "" -> None): rank r uses cuda:(r mod that)."""
    return len([g for g in gpus.split(",") if g.strip()]) or None


def _quietly(step) -> None:
    try:
        step()
    except Exception:  # noqa: BLE001 - cleanup goes on; the launch's record says what failed
        pass


def _drain(launch: _Launch) -> None:
    """What the ranks printed just before they died (their pipes close when they do)."""
    end = time.monotonic() + 1.0
    while time.monotonic() < end and any(k.data[0] == "out"
                                         for k in launch.sel.get_map().values()):
        launch.pump(0.02)


def _close(launch: _Launch) -> None:
    for key in list(launch.sel.get_map().values()):
        launch.sel.unregister(key.fileobj)
        if isinstance(key.fileobj, int):
            os.close(key.fileobj)
    for sock in launch.socks:
        sock.close()
    launch.sel.close()


__all__ = ["LIMIT_KINDS", "run_launch"]
