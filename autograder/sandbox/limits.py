"""The limits a submission runs under, and how the sandbox process is started with them.

Layers, each a backstop for the others (a grade must survive anything a submission does):

* **rlimits**, inherited by every rank and anything they start: address space per process
  (a memory bomb gets MemoryError), CPU seconds, file size (a disk bomb), open files, and
  processes (a fork bomb gets EAGAIN). RLIMIT_NPROC counts every task of the *user*, and root
  ignores it: so a grader running as root (Gradescope, a container) runs each submission as its
  own unused uid, which also makes the final sweep exact (kill every process of that uid) and
  keeps concurrent grades out of each other's files. Not root (a student's laptop): the limit
  is the user's current task count plus `processes`. Root that cannot hand out a uid (an
  interpreter strangers may not run) keeps uid 0 but drops every capability
  (`drop_capabilities`); Landlock's signal scope keeps its kill() inside the sandbox.
* **Landlock** (`landlock.restrict`): reading only Python, the installed packages, `toolkit`'s
  launcher and recorder, and the submission's own working folder; writing only there. The lab's
  folder (reference solutions, hidden checks) and the grader's output folder are out of reach.
* **The grader's watchdog** (`autograder.runner`): wall time, the summed memory and number of
  processes of the whole tree, and output size, measured from outside and enforced by SIGKILL.
"""

from __future__ import annotations

import ctypes
import os
import resource
import sys
from dataclasses import dataclass
from pathlib import Path

import toolkit

MB = 1 << 20


@dataclass(frozen=True)
class Limits:
    """What one grade may use. The defaults fit a lab on 4 CPU ranks with room to spare."""

    wall_s: float = 180.0
    """Wall-clock seconds for the whole grade (every check); each check also has its own."""
    memory_mb: int = 2048
    """Address space per process, MiB (a gloo rank maps ~0.8 GB before allocating anything)."""
    total_memory_mb: int = 4096
    """Resident memory of the whole process tree, MiB, checked by the watchdog."""
    processes: int = 96
    """Tasks (processes and threads) the submission's user may add: 4 ranks use ~25."""
    cpu_s: int = 600
    """CPU seconds per process."""
    file_mb: int = 64
    """Largest file a process may write, MiB."""
    output_mb: float = 4.0
    """Bytes of stdout + stderr kept from the sandbox, MiB; more ends the grade (output_limit)."""
    disk_mb: float = 256.0
    """Bytes of files in the working folder's tmp/ (the one place a rank may write), MiB, checked
    by the watchdog; more ends the grade (disk_limit): file_mb caps one file, not how many."""

    def __post_init__(self) -> None:
        for name in ("wall_s", "memory_mb", "total_memory_mb", "processes", "cpu_s", "file_mb",
                     "output_mb", "disk_mb"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"Limits({name}=...) must be a positive number, got {value!r}")


def sandbox_uid() -> int | None:
    """A fresh unprivileged uid for one grade when running as root, else None (keep ours).

    Uids 200000-265535 are outside the ranges distributions give to users and services; the
    pid of the grading process makes concurrent grades on one host differ. None also where a
    stranger could not run this Python (e.g. an interpreter under root's mode-700 home): the
    grade then keeps uid 0 and relies on the pids cgroup and the watchdog for processes."""
    if os.geteuid() != 0 or not _world_can_run(Path(sys.executable).resolve()):
        return None
    return 200_000 + os.getpid() % 65_536


def _world_can_run(path: Path) -> bool:
    """Every folder above `path` is searchable by others and the file is executable."""
    for folder in path.parents:
        if not os.stat(folder).st_mode & 0o001:
            return False
    return bool(os.stat(path).st_mode & 0o001)


def _tasks_of_user(uid: int) -> int:
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry.name}/task"))
            except OSError:
                pass
    return count


def preexec(limits: Limits, uid: int | None, group=None):
    """The function `subprocess.Popen(preexec_fn=...)` runs in the child before exec: a new
    session, the pids cgroup if any, the rlimits, and (as root) the grade's own uid and gid,
    dropped last."""
    nproc = limits.processes if uid is not None else _tasks_of_user(os.getuid()) + limits.processes

    def apply() -> None:
        os.setsid()
        if group is not None:
            group.join()
        for which, value in (
            (resource.RLIMIT_AS, limits.memory_mb * MB),
            (resource.RLIMIT_CPU, limits.cpu_s),
            (resource.RLIMIT_FSIZE, limits.file_mb * MB),
            (resource.RLIMIT_NOFILE, 1024),
            (resource.RLIMIT_NPROC, nproc),
            (resource.RLIMIT_CORE, 0),
        ):
            soft, hard = resource.getrlimit(which)
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(which, (value, value))
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        elif os.geteuid() == 0:
            drop_capabilities()

    return apply


_PR_CAPBSET_DROP = 24
_CAPABILITY_VERSION_3 = 0x20080522  # linux/capability.h: two 32-bit words per set


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def drop_capabilities() -> None:
    """Give up every capability, for this process and whatever it executes (capabilities(7)):
    a grade that stays uid 0 (no uid of its own could be given) must not keep root's powers to
    reboot, mount, load modules, chown, open raw sockets or trace other processes. The
    bounding set goes first (so that exec as uid 0 cannot regain any), then the process's own
    sets. Files stay reachable as uid 0's by their permission bits."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in range(64):  # EINVAL past the kernel's last capability: nothing to drop
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)
    data = (_CapData * 2)()
    if libc.capset(ctypes.byref(_CapHeader(_CAPABILITY_VERSION_3, 0)), data) != 0:
        raise OSError(ctypes.get_errno(), "capset: could not drop the capabilities")


def sandbox_paths(workdir: Path, toolkit_modules=()) -> tuple[list[str], list[str], list[str]]:
    """(read, write, list_only) path lists for `landlock.restrict`: the interpreter and its
    packages, the system libraries, the parts of `toolkit` a rank needs (not its reference
    algorithms, which a lab may ask students to write), and the working folder."""
    pkg = Path(toolkit.__file__).resolve().parent
    read = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
            "/usr", "/lib", "/lib64", "/lib32", "/etc", "/proc", "/sys", "/bin", "/sbin",
            str(Path(sys.executable).resolve().parent.parent)}
    for entry in sys.path:  # site-packages and friends (a venv's may sit outside its prefix)
        if entry and Path(entry).is_dir() and "site-packages" in entry:
            read.add(entry)
    # arguments.py: the argument checks that toolkit.models (a lab's sandbox module) imports.
    read |= {str(pkg / "__init__.py"), str(pkg / "launch"), str(pkg / "comm"),
             str(pkg / "arguments.py")}
    for name in toolkit_modules:  # what a lab's harness needs (LabInfo.sandbox_modules)
        if not name.replace("_", "").isalnum():
            raise ValueError(f"sandbox module {name!r} must be a plain toolkit module name")
        read |= {str(pkg / name), str(pkg / f"{name}.py")}
    read.add(str(Path(__file__).resolve().parent))  # the rank-side harness lives here
    read.add(str(Path(__file__).resolve().parent.parent / "__init__.py"))
    write = [str(workdir), "/dev"]
    list_only = [str(pkg), str(Path(__file__).resolve().parent.parent)]
    return sorted(read), write, list_only


__all__ = ["Limits", "MB", "drop_capabilities", "preexec", "sandbox_paths", "sandbox_uid"]
