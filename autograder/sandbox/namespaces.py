"""Namespaces of one rank: user (when the grader is not root), mount, pid, network, IPC, UTS
and cgroup (namespaces(7), unshare(2), user_namespaces(7), pid_namespaces(7)).

`fork_isolated(child)` starts a rank as pid 1 of a pid namespace of its own.
``unshare(CLONE_NEWPID)`` moves only the caller's *children* into the new namespace. As root the
fork server unshares it, forks the rank, and returns to its own namespace for the next one
(``setns``: one fork per rank, as before). A user cannot return (``setns`` to the initial pid
namespace needs a capability there), so it takes two forks: the server forks an intermediate,
which makes a user and a pid namespace and forks the rank, then exits at once; the server, a
child subreaper, adopts the rank. The rank then makes its other namespaces itself
(`unshare_rest`, from `confine`). What each namespace gives the rank:

* **mount**: a root of its own (`world`): no other rank's or grade's folder exists in it;
* **pid**: it is pid 1 and sees only its own children (no pid of the fork server, the grader, a
  peer or the host to signal, trace or read in /proc); when it dies, the kernel kills every
  process left in its namespace, so nothing it started outlives it;
* **network**: one loopback interface, down: no route anywhere, its own abstract unix sockets;
* **IPC**: its own System V and POSIX message queues, semaphores and shared memory;
* **UTS**: its own host name ("rank"); **cgroup** (`unshare_cgroup`, after it joined its launch's
  group): /proc/self/cgroup shows "/" instead of the grade's path;
* **user** (a grader that is not root): the rank's uid is the user's, mapped to itself, and its
  capabilities are those of its own namespace only (enough to build its world, then dropped).
  As root no user namespace is made: each rank takes a uid of its own instead (`limits.become`).

A host that refuses any of these raises `IsolationError` saying which and what to do; the grade
then refuses to run ranks (docs/grading.md, "Hosts that cannot build the sandbox").
`isolate` is the old best effort, kept for ``grade --unconfined`` only.
"""

from __future__ import annotations

import ctypes
import os
from typing import Callable, NoReturn

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS = 0x00020000, 0x02000000, 0x04000000
CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = (0x08000000, 0x10000000, 0x20000000,
                                                           0x40000000)
RANK_NAMESPACES = ("mount", "pid", "network", "IPC", "UTS", "cgroup")

ROOT_ADVICE = ("the grader runs as root without CAP_SYS_ADMIN (a container started without "
               "it, or whose seccomp profile forbids unshare): give the container "
               "CAP_SYS_ADMIN (docker run --cap-add SYS_ADMIN --security-opt seccomp=unconfined "
               "...), or grade as a non-root user on a host that allows user namespaces")
USER_ADVICE = ("this host does not let a user make namespaces (user.max_user_namespaces = 0, "
               "kernel.unprivileged_userns_clone = 0, or Ubuntu's AppArmor "
               "kernel.apparmor_restrict_unprivileged_userns = 1): grade as root (e.g. in a "
               "container), allow unprivileged user namespaces, or, for your own work only, "
               "grade with --unconfined (not sandboxed)")


class IsolationError(RuntimeError):
    """A layer of the sandbox could not be built on this host: the words say which and what to
    do about it."""


def _unshare(flags: int) -> int:
    """0, or the errno of a failed unshare(2)."""
    return 0 if ctypes.CDLL(None, use_errno=True).unshare(flags) == 0 else ctypes.get_errno()


def _map_ids(uid: int, gid: int) -> None:
    """In a new user namespace: keep our own ids (as the only ids mapped)."""
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")


def advice() -> str:
    return ROOT_ADVICE if os.geteuid() == 0 else USER_ADVICE


def _user_namespace() -> None:
    """A user namespace where this process keeps its uid and holds every capability."""
    uid, gid = os.geteuid(), os.getegid()
    err = _unshare(CLONE_NEWUSER)
    if err:
        raise IsolationError(f"user namespace: unshare failed ({os.strerror(err)}): "
                             f"{USER_ADVICE}")
    try:
        _map_ids(uid, gid)
    except OSError as exc:
        raise IsolationError(f"user namespace: its uid map was refused ({exc.strerror}): "
                             f"{USER_ADVICE}") from None


def _pid_namespace() -> None:
    err = _unshare(CLONE_NEWPID)
    if err:
        raise IsolationError(f"pid namespace: unshare failed ({os.strerror(err)}): {advice()}")


def unshare_rest() -> None:
    """Mount, network, IPC and UTS namespaces for this process (a rank, pid 1 of its own pid
    namespace, before it builds its world); its host name becomes "rank" (not the host's)."""
    libc = ctypes.CDLL(None, use_errno=True)
    err = _unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS)
    if err or libc.sethostname(b"rank", 4) != 0:
        err = err or ctypes.get_errno()
        raise IsolationError(f"mount, network, IPC and UTS namespaces: unshare failed "
                             f"({os.strerror(err)}): {advice()}")


def unshare_cgroup() -> None:
    """A cgroup namespace rooted at the group this process is in (its launch's)."""
    err = _unshare(CLONE_NEWCGROUP)
    if err:
        raise IsolationError(f"cgroup namespace: unshare failed ({os.strerror(err)}): "
                             f"{advice()}")


_OWN_PID_NS: list[int] = []


def fork_isolated(child: Callable[[], NoReturn]) -> int:
    """Run `child` as pid 1 of a pid namespace of its own (see the module docstring); returns
    its pid as this process sees it. As a user, the caller must be a child subreaper
    (`set_subreaper`), so that the rank is its child once the intermediate has exited. Raises
    `IsolationError`."""
    if os.geteuid() == 0:
        return _fork_as_root(child)
    read, write = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.close(read)
        try:
            _user_namespace()
            _pid_namespace()
            pid = os.fork()
        except BaseException as exc:  # noqa: BLE001 - the words go back to the fork server
            os.write(write, f"error {exc}".encode(errors="replace")[:4000])
            os._exit(1)
        if pid == 0:
            os.close(write)
            child()
        os.write(write, f"pid {pid}".encode())
        os._exit(0)
    os.close(write)
    answer = b""
    while chunk := os.read(read, 4096):
        answer += chunk
    os.close(read)
    os.waitpid(middle, 0)  # once it is reaped, the rank has been re-parented to us
    word, _, rest = answer.decode(errors="replace").partition(" ")
    if word != "pid":
        raise IsolationError(rest or "the process that makes a rank's namespaces died")
    return int(rest)


def _fork_as_root(child: Callable[[], NoReturn]) -> int:
    if not _OWN_PID_NS:
        _OWN_PID_NS.append(os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC))
    _pid_namespace()
    try:
        pid = os.fork()
        if pid == 0:
            child()
    finally:  # the next child is born in our own namespace again (the child never gets here)
        if ctypes.CDLL(None, use_errno=True).setns(_OWN_PID_NS[0], CLONE_NEWPID) != 0:
            raise IsolationError(f"pid namespace: setns back failed "
                                 f"({os.strerror(ctypes.get_errno())})")
    return pid


def set_subreaper() -> None:
    """Adopt orphaned descendants (prctl PR_SET_CHILD_SUBREAPER)."""
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)


def isolate() -> str:
    """``grade --unconfined`` only: new network and IPC namespaces where the host allows them.
    Returns how: "namespaces" (as root), "user namespace" (unprivileged), or ""."""
    if not _unshare(CLONE_NEWNET | CLONE_NEWIPC):
        return "namespaces"
    uid, gid = os.getuid(), os.getgid()
    if not _unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWIPC):
        try:
            _map_ids(uid, gid)
        except OSError:
            pass
        return "user namespace"
    return ""


__all__ = ["IsolationError", "RANK_NAMESPACES", "advice", "fork_isolated", "isolate",
           "set_subreaper", "unshare_cgroup", "unshare_rest"]
