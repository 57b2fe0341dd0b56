"""The limits a submission runs under, and the process-level steps that apply them.

Layers, each a backstop for the others (a grade must survive anything a submission does):

* **rlimits**, set in each rank before the student's module is imported (`apply_rlimits`) and
  inherited by anything it starts: address space per process, counted from what the rank has
  mapped when it starts (a memory bomb gets MemoryError; `address_space_now`),
  CPU seconds, file size, open files, processes (RLIMIT_NPROC counts every task of the *user*
  and root ignores it: a grader running as root runs each rank as a uid of its own,
  `sandbox_uid` and `rank_uid`; not root, the limit is the user's task count plus `processes`).
* **uid and capabilities** (`become`): as root each rank takes its own uid from a reserved
  block once its world is built, which clears every capability; in a user namespace it keeps
  the user's uid and clears the capabilities of its namespace. No rank runs as uid 0.
* **The grader's watchdog** (`autograder.sandbox.watchdog`): wall time, the summed memory and
  number of tasks of each launch, its output and its files, measured from outside and enforced
  with SIGKILL.

Where the files, the network, the other ranks and the system calls are concerned, see
`paths`, `landlock`, `namespaces` and `seccomp`; `confine` applies them all in order.
"""

from __future__ import annotations

import ctypes
import os
import resource
from dataclasses import dataclass

MB = 1 << 20


@dataclass(frozen=True)
class Limits:
    """What one grade may use. The defaults fit a lab on 4 CPU ranks with room to spare."""

    wall_s: float = 180.0
    """The grade's total budget, wall-clock seconds: every launch, and a fresh fork server
    after a lost one, fit in it; each check also has its own timeout per launch."""
    memory_mb: int = 2048
    """Address space per process, MiB (a gloo rank maps ~0.8 GB before allocating anything)."""
    total_memory_mb: int = 4096
    """Resident memory of one launch's processes together, MiB, checked by the watchdog."""
    processes: int = 96
    """Tasks (processes and threads) the submission's user may add: 4 ranks use ~25."""
    cpu_s: int = 600
    """CPU seconds per process."""
    file_mb: int = 64
    """Largest file a process may write, MiB."""
    output_mb: float = 4.0
    """Bytes one launch's ranks may print (stdout + stderr), MiB; more ends that launch
    (output_limit) and costs its check only."""
    disk_mb: float = 256.0
    """Bytes in one launch's rank folders (the only places a rank may write), MiB, checked by the
    watchdog with every entry counted (`MAX_ENTRIES` files and folders); more ends that launch
    (disk_limit): file_mb caps one file, not how many."""

    def __post_init__(self) -> None:
        for name in ("wall_s", "memory_mb", "total_memory_mb", "processes", "cpu_s", "file_mb",
                     "output_mb", "disk_mb"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"Limits({name}=...) must be a positive number, got {value!r}")


UID_BASE = 1 << 30
"""First uid of the block the grader gives its ranks as root: far above the ranges
distributions give to users (1000-60000), services and subordinate ids (100000 + 65536·k)."""
MAX_RANKS = 16
"""Uids per grade: a launch of up to 16 ranks gets one uid per rank."""


def sandbox_uid() -> int | None:
    """The first uid of this grade's block when running as root, else None (ranks then run in
    user namespaces as the user). Grade g (its grader's pid, unique among the host's live
    processes, < 2**22) owns uids UID_BASE + 16·g ... + 15; rank r of every launch of the grade
    runs as the block's r-th (`rank_uid`), so no two ranks that run at once share a uid, no
    rank shares one with any other process, and none is 0."""
    if os.geteuid() != 0:
        return None
    return UID_BASE + os.getpid() * MAX_RANKS


def rank_uid(base: int | None, rank: int) -> int | None:
    """Rank `rank`'s uid in the grade whose block starts at `base` (None: not root)."""
    if base is None:
        return None
    if not 0 <= rank < MAX_RANKS:
        raise ValueError(f"rank {rank}: the sandbox gives at most {MAX_RANKS} ranks a uid of "
                         "their own (a launch of more ranks cannot be graded)")
    return base + rank


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


def address_space_now() -> int:
    """Bytes of address space this process has mapped (/proc/self/statm's size; 0 if unknown)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def apply_rlimits(limits: Limits, uid: int | None, *, address_space: bool = True) -> None:
    """Set this process's rlimits (soft = hard, never above an existing hard limit).

    RLIMIT_AS is what the rank has mapped now plus ``memory_mb``: the cap is on what the
    rank's own code maps, not on the libraries the fork server had loaded. A CUDA build of
    torch maps several GiB of CUDA libraries at import without touching a GPU (a CPU torch,
    about 0.6 GiB): an absolute 2 GiB cap set below what is already mapped makes every later
    allocation fail, in every rank of a CPU grade on a GPU machine. ``address_space=False`` (a
    cuda grade's ranks) leaves RLIMIT_AS alone: the CUDA driver reserves tens of GiB of
    virtual addresses when it starts (unified addressing), far past any useful cap on what a
    rank touches; the watchdog's sum of the launch's resident memory and the GPU's own memory
    bound it instead."""
    nproc = limits.processes if uid is not None else _tasks_of_user(os.getuid()) + limits.processes
    for which, value in (
        *(((resource.RLIMIT_AS, address_space_now() + limits.memory_mb * MB),)
          if address_space else ()),
        (resource.RLIMIT_CPU, limits.cpu_s),
        (resource.RLIMIT_FSIZE, limits.file_mb * MB),
        (resource.RLIMIT_NOFILE, 1024),
        (resource.RLIMIT_NPROC, nproc),
        (resource.RLIMIT_CORE, 0),
    ):
        soft, hard = resource.getrlimit(which)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (value, value))


def become(uid: int | None) -> None:
    """Take `uid` (as root: the rank's own), then hold no capability at all. The bounding set
    goes first (it takes CAP_SETPCAP, which the uid change clears); changing every uid from 0
    to `uid` clears the permitted, effective and ambient sets (capabilities(7)); a rank in a
    user namespace keeps its uid and clears its sets itself."""
    _drop_bounding()
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    drop_capabilities()


def fork_server_preexec(group=None):
    """What `subprocess.Popen(preexec_fn=...)` runs in the fork server before exec: its own
    session, the grade's pids cgroup (its ranks follow), no core files. It keeps root's
    capabilities: each rank makes its namespaces before dropping them."""

    def apply() -> None:
        os.setsid()
        if group is not None:
            group.join()
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_CAPABILITY_VERSION_3 = 0x20080522  # linux/capability.h: two 32-bit words per set


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def has_capabilities() -> bool:
    try:
        for line in open("/proc/self/status"):
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16) != 0
    except OSError:
        pass
    return os.geteuid() == 0


def _drop_bounding() -> None:
    """Empty the bounding set (each drop needs CAP_SETPCAP; without it, nothing changes)."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in range(64):  # EINVAL past the kernel's last capability: nothing to drop
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)


def capability_sets() -> dict[str, int]:
    """This process's capability sets as /proc/self/status shows them (a rank's self-check)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Cap"):
                name, value = line.split(":")
                out[name] = int(value, 16)
    return out


def drop_capabilities() -> None:
    """Give up every capability, for this process and whatever it executes (capabilities(7)):
    a grade that stays uid 0 (no uid of its own could be given) must not keep root's powers to
    reboot, mount, load modules, chown, open raw sockets or trace other processes. The
    bounding set goes first (so that exec as uid 0 cannot regain any), then the process's own
    sets. Files stay reachable as uid 0's by their permission bits."""
    if not has_capabilities():
        return
    _drop_bounding()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    data = (_CapData * 2)()
    if libc.capset(ctypes.byref(_CapHeader(_CAPABILITY_VERSION_3, 0)), data) != 0:
        raise OSError(ctypes.get_errno(), "capset: could not drop the capabilities")


__all__ = ["Limits", "MAX_RANKS", "MB", "UID_BASE", "address_space_now", "apply_rlimits", "become",
           "capability_sets", "drop_capabilities", "fork_server_preexec", "has_capabilities",
           "rank_uid", "sandbox_uid"]
