"""The grader's side of one sandboxed run: prepare the folder, start the supervisor under the
limits, watch it from outside, end every process, and read back what it observed.

The watchdog polls every 50 ms: wall time, the summed resident memory and the number of tasks of
the whole tree (the pids cgroup's member list where there is one, else the tree below the
supervisor, with this process as child subreaper so that orphans stay in the tree), and the
bytes the ranks have written to their logs. Over a limit, everything is killed and the run
carries the limit's name (`RunResult.limit`). Whatever happens, `run_sandboxed` returns only
after every process of the run is gone.

Observations are read as JSON, line by line, with a size cap: the sandbox cannot make this
process execute anything.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from .sandbox.cgroup import PidsGroup
from .sandbox.limits import MB, Limits, preexec, sandbox_uid

MAX_OBSERVATIONS = 256 * MB
LOG_TAIL_BYTES = 6000  # per rank's log: faulthandler's dump of an abort is ~2-3 kB
_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37


@dataclass
class RunResult:
    """What one sandboxed run left behind, as the grader sees it."""

    records: dict[str, dict] = field(default_factory=dict)
    """Group id → the supervisor's record (status, ranks' observations or the failure)."""
    sandbox: str = "none"
    """How the run was confined, e.g. "landlock v7, uid 201234, pids cgroup"."""
    limit: str | None = None
    """Which limit ended the run early: wall_limit, memory_limit, process_limit, output_limit,
    disk_limit."""
    limit_detail: str = ""
    seconds: float = 0.0
    exit_code: int | None = None
    output: str = ""
    """The supervisor's own stdout + stderr (capped), for errors outside any rank."""
    log_bytes: dict[str, int] = field(default_factory=dict)
    """Group id → bytes the ranks of that group printed."""
    log_tail: dict[str, str] = field(default_factory=dict)
    forged: list[str] = field(default_factory=list)
    """Files named like a grade (results.json) that the submission wrote in its folder."""


def _set_subreaper(on: bool) -> bool:
    """Make this process the child subreaper of the sandbox's orphans (on) or stop being one;
    returns whether it was one before. Left on, every orphaned grandchild of anything this
    process starts later (a test's SLURM daemons) would become a zombie nobody reaps."""
    try:
        libc = ctypes.CDLL(None)
        was = ctypes.c_int(0)
        libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(was), 0, 0, 0)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)
        return bool(was.value)
    except (AttributeError, OSError):
        return False


def _tree(root: int, group: PidsGroup | None) -> list[psutil.Process]:
    procs: dict[int, psutil.Process] = {}
    pids = group.pids() if group else []
    for pid in pids:
        try:
            procs[pid] = psutil.Process(pid)
        except psutil.Error:
            pass
    try:
        top = psutil.Process(root)
        for p in [top] + top.children(recursive=True):
            procs[p.pid] = p
    except psutil.Error:
        pass
    return list(procs.values())


def _measure(procs: list[psutil.Process]) -> tuple[int, int]:
    """(resident bytes, tasks) of the processes; forked ranks share pages, so RSS overcounts:
    the memory limit is a ceiling on the sum, set with that in mind."""
    rss = tasks = 0
    for p in procs:
        try:
            rss += p.memory_info().rss
            tasks += p.num_threads()
        except psutil.Error:
            pass
    return rss, tasks


def _sweep(root: int, group: PidsGroup | None, uid: int | None,
           theirs: frozenset[int] = frozenset()) -> None:
    """SIGKILL every process of the run and reap the ones that are our children (`theirs`:
    the caller's own children from before the run, never waited for here)."""
    for _ in range(200):
        procs = _tree(root, group)
        if uid is not None:
            for p in psutil.process_iter(["uids"]):
                try:
                    if p.info["uids"] and p.info["uids"].real == uid:
                        procs.append(p)
                except psutil.Error:
                    pass
        alive = [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        for p in alive:
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass
        _reap(theirs)
        if not alive:
            break
        time.sleep(0.02)
    if group is not None:
        group.kill_all()
    _reap(theirs)


def _children() -> frozenset[int]:
    try:
        return frozenset(p.pid for p in psutil.Process().children())
    except psutil.Error:
        return frozenset()


def _reap(theirs: frozenset[int] = frozenset()) -> None:
    """Wait for our exited children: the supervisor and orphans re-parented to us (subreaper).
    Not ``waitpid(-1)``: that would also take the exit status of a child the caller started
    (its `Popen.wait()` would then say 0 for a process that was killed)."""
    for pid in _children() - theirs:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


MAX_FILES = 10_000  # files a run may leave in tmp/: counting them each poll must stay cheap


def _disk(folder: Path) -> tuple[int, int]:
    """(bytes on disk, files) below `folder`, counting at most MAX_FILES + 1 files."""
    used = files = 0
    stack = [str(folder)]
    while stack and files <= MAX_FILES:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                else:
                    files += 1
                    used += entry.stat(follow_symlinks=False).st_blocks * 512
            except OSError:
                pass
    return used, files


def _pump(stream, sink: bytearray, cap: int) -> None:
    while chunk := stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536):
        if len(sink) < cap:
            sink.extend(chunk[: cap - len(sink)])


def prepare_workdir(files: dict[str, bytes], base: Path | None = None) -> Path:
    """A fresh private folder holding `files` (name → content) for one run."""
    workdir = Path(tempfile.mkdtemp(prefix="grade-", dir=base))
    for name, content in files.items():
        (workdir / name).write_bytes(content)
    (workdir / "tmp").mkdir()
    return workdir


def run_sandboxed(workdir: Path, job: dict, limits: Limits, *, landlock: bool = True) -> RunResult:
    """Run the supervisor on `job` in `workdir` under `limits`; always returns, never leaves a
    process behind."""
    was_subreaper = _set_subreaper(True)
    try:
        return _run(workdir, job, limits, landlock)
    finally:
        _set_subreaper(was_subreaper)


def _run(workdir: Path, job: dict, limits: Limits, landlock: bool) -> RunResult:
    theirs = _children()
    job = dict(job, workdir=str(workdir), landlock=landlock)
    (workdir / "job.json").write_text(json.dumps(job))
    uid = sandbox_uid()
    group = PidsGroup.create(f"autograder-{os.getpid()}-{time.monotonic_ns()}", limits.processes)
    if uid is not None:
        for path in [workdir, *workdir.rglob("*")]:
            os.chown(path, uid, uid)
    os.chmod(workdir, 0o700)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(workdir),
           "TMPDIR": str(workdir / "tmp"), "OMP_NUM_THREADS": "1",
           # Labs are graded on CPU ranks (gloo) wherever the grader runs: a result must not
           # depend on the hardware, and a GPU node's NCCL would refuse the labs' CPU tensors.
           "CUDA_VISIBLE_DEVICES": "", "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONUNBUFFERED": "1", "LANG": "C.UTF-8"}
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "autograder.sandbox.supervisor", str(workdir / "job.json")],
        cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, preexec_fn=preexec(limits, uid, group), close_fds=True)
    output = bytearray()
    reader = threading.Thread(target=_pump, args=(proc.stdout, output, 64 * 1024), daemon=True)
    reader.start()
    result = RunResult()
    try:
        ranks = max((int(g.get("world_size", 1)) for g in job.get("groups", [])), default=1)
        _watch(proc, group, workdir, limits, start, result, ranks)
    finally:
        _sweep(proc.pid, group, uid, theirs)
        reader.join(timeout=5)
        proc.stdout.close()
    result.seconds = time.monotonic() - start
    result.exit_code = proc.returncode
    result.output = output.decode("utf-8", "replace")
    _collect(workdir, result)
    if group is not None:
        result.sandbox += ", pids cgroup"
    if uid is not None:
        result.sandbox += f", uid {uid}"
    return result


def _watch(proc, group, workdir: Path, limits: Limits, start: float, result: RunResult,
           ranks: int = 1) -> None:
    """Poll until the supervisor ends or a limit is passed (`result.limit` says which).
    `ranks`: the most ranks a group runs; with the supervisor, the processes a run needs."""
    polls = 0
    while proc.poll() is None:
        elapsed = time.monotonic() - start
        procs = _tree(proc.pid, group)
        rss, tasks = _measure(procs)
        printed = sum(f.stat().st_size for f in (workdir / "logs").glob("*.log")) \
            if (workdir / "logs").is_dir() else 0
        # Files in tmp/ (every 0.25 s): RLIMIT_FSIZE caps one file, not a thousand of them.
        disk, files = _disk(workdir / "tmp") if polls % 5 == 0 else (0, 0)
        polls += 1
        if elapsed > limits.wall_s:
            result.limit, result.limit_detail = "wall_limit", f"ran for over {limits.wall_s:g} s"
        # Processes before memory: each forked copy counts its shared pages again in the
        # summed RSS, so a fork bomb also looks like a memory bomb a moment later.
        elif tasks > limits.processes or (group is not None and group.hit_limit()):
            result.limit = "process_limit"
            result.limit_detail = f"started over {limits.processes} processes or threads"
        elif rss > limits.total_memory_mb * MB and len(procs) > ranks + 1:
            # Forked copies share their parent's pages, so the summed RSS of a fork bomb
            # passes the memory limit long before the memory is really used.
            result.limit = "process_limit"
            result.limit_detail = (f"started {len(procs) - 1} processes where the lab runs at "
                                   f"most {ranks} ranks (a fork bomb?)")
        elif rss > limits.total_memory_mb * MB:
            result.limit = "memory_limit"
            result.limit_detail = (f"the ranks held {rss / MB:,.0f} MiB together; the limit is "
                                   f"{limits.total_memory_mb:,} MiB")
        elif disk > limits.disk_mb * MB or files > MAX_FILES:
            result.limit = "disk_limit"
            result.limit_detail = (f"wrote {disk / MB:,.0f} MiB in {files:,} files to disk; the "
                                   f"limits are {limits.disk_mb:g} MiB and {MAX_FILES:,} files")
        elif printed > limits.output_mb * MB:
            result.limit = "output_limit"
            result.limit_detail = (f"printed {printed / MB:,.1f} MiB; the limit is "
                                   f"{limits.output_mb:g} MiB")
        if result.limit:
            return
        time.sleep(0.05)
    if group is not None and group.hit_limit():  # a refused fork ended the run by itself
        result.limit = "process_limit"
        result.limit_detail = f"tried to start over {limits.processes} processes or threads"


def _collect(workdir: Path, result: RunResult) -> None:
    path = workdir / "observations.jsonl"
    if path.is_file() and path.stat().st_size <= MAX_OBSERVATIONS:
        for line in path.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a kill
            if not isinstance(record, dict):
                continue
            if "sandbox" in record and "group" not in record:
                result.sandbox = str(record["sandbox"])
            elif isinstance(record.get("group"), str):
                result.records[record["group"]] = record
    logs = workdir / "logs"
    if logs.is_dir():
        for log in sorted(logs.glob("*.log")):
            gid = log.name.split(".rank")[0]
            result.log_bytes[gid] = result.log_bytes.get(gid, 0) + log.stat().st_size
            with open(log, "rb") as f:  # enough for gloo's abort message above a stack dump
                f.seek(max(0, log.stat().st_size - LOG_TAIL_BYTES))
                tail = f.read().decode("utf-8", "replace")
            if tail.strip():
                result.log_tail[gid] = (result.log_tail.get(gid, "") + tail)[-4 * LOG_TAIL_BYTES:]
    result.forged = sorted(str(p.relative_to(workdir)) for p in workdir.rglob("results.json"))


def remove_workdir(workdir: Path) -> None:
    shutil.rmtree(workdir, ignore_errors=True)


__all__ = ["RunResult", "prepare_workdir", "remove_workdir", "run_sandboxed"]
