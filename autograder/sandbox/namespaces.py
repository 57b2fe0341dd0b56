"""A network and an IPC namespace of its own for each rank (namespaces(7), unshare(2)).

In a fresh network namespace a rank has one loopback interface, down, and nothing else: no
route to the host's loopback services, to the internet, or to another rank, and its own
table of abstract unix sockets. A fresh IPC namespace gives it its own System V and POSIX
message queues, semaphores and shared memory. Root (or CAP_SYS_ADMIN) unshares both directly;
elsewhere `isolate` tries a user namespace first (unprivileged user namespaces; some
distributions forbid them) and says what it got, so a grade can report what is missing.
"""

from __future__ import annotations

import ctypes
import os

CLONE_NEWNET, CLONE_NEWIPC, CLONE_NEWUSER = 0x40000000, 0x08000000, 0x10000000


def _unshare(flags: int) -> bool:
    return ctypes.CDLL(None, use_errno=True).unshare(flags) == 0


def _map_ids(uid: int, gid: int) -> None:
    """In a new user namespace: keep our own ids (as the only ids mapped)."""
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")


def isolate() -> str:
    """Put this process into new network and IPC namespaces. Returns how: "namespaces" (as
    root), "user namespace" (unprivileged), or "" when the host allows neither."""
    if _unshare(CLONE_NEWNET | CLONE_NEWIPC):
        return "namespaces"
    uid, gid = os.getuid(), os.getgid()
    if _unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWIPC):
        try:
            _map_ids(uid, gid)
        except OSError:
            pass
        return "user namespace"
    return ""


__all__ = ["isolate"]
