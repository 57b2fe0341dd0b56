"""Confine a process's file-system reach with Linux Landlock (kernel ≥ 5.13, no root needed).

After `restrict(read=[...], write=[...])` the calling process, and every process it starts
afterwards, can read only below the `read` paths and write only below the `write` paths; any
other open fails with PermissionError (EACCES). That is what keeps the reference solutions and
hidden checks out of a submission's reach: they live in the lab's folder, which is in neither
list (see `autograder.sandbox.limits.sandbox_paths`). From ABI 6 (Linux 6.12) it also cannot
signal a process outside its domain (`kill` fails with EPERM): a grade running as root keeps
its ranks from killing the host's processes, and cannot connect to an abstract unix socket
bound outside its domain (``scopes``). From ABI 4 (Linux 6.7) TCP ``bind`` and ``connect`` are
refused unless a rule allows a port (`restrict(..., tcp=False)` allows none); from ABI 5
(Linux 6.10) ioctl on device files is refused too. It cannot be undone from inside: Landlock
only ever adds restrictions, and ``no_new_privs`` (set first, as Landlock requires) stops
setuid programs from regaining anything.

The kernel interface (Documentation/userspace-api/landlock.rst): create a ruleset naming the
access rights to handle, add one ``path_beneath`` rule per allowed folder or file, then
``landlock_restrict_self``. Rights a kernel's ABI does not know are dropped from the request
(ABI 1 lacks REFER, ABI 3 adds TRUNCATE), so one call works on every version.
"""

from __future__ import annotations

import ctypes
import os
from typing import Iterable

# Syscall numbers are the same on x86_64 and aarch64 (added in Linux 5.13 with generic numbers).
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

# Access rights for files (LANDLOCK_ACCESS_FS_*), from include/uapi/linux/landlock.h.
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = 1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12
REFER, TRUNCATE = 1 << 13, 1 << 14          # ABI 2, ABI 3
IOCTL_DEV = 1 << 15                         # ABI 5: ioctl on character and block devices

# Network rights (ABI 4, Linux 6.7): handled with no rule, TCP bind and connect are refused.
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1

# Scopes (ABI 6, Linux 6.12): what a sandboxed process may not reach outside its own domain.
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # no connect to abstract unix sockets bound outside it
SCOPE_SIGNAL = 1 << 1  # LANDLOCK_SCOPE_SIGNAL: no signals to processes outside the domain

READ = EXECUTE | READ_FILE | READ_DIR
WRITE = (WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_CHAR | MAKE_DIR | MAKE_REG | MAKE_SOCK
         | MAKE_FIFO | MAKE_BLOCK | MAKE_SYM | REFER | TRUNCATE)
WRITE_PLAIN = WRITE & ~(MAKE_SOCK | MAKE_FIFO | MAKE_CHAR | MAKE_BLOCK | MAKE_SYM)
"""Write regular files and folders only: no socket, FIFO, device node or symbolic link may be
created (a rank's folder then holds nothing another process could block on or be led by)."""
_FILE_ONLY = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV  # rights a file rule may carry


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64)]


class _RulesetAttrScoped(ctypes.Structure):  # ABI 4: network rights; ABI 6: scopes
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # the kernel's struct is __attribute__((packed))
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def abi_version() -> int:
    """The kernel's Landlock ABI version, or 0 where Landlock is missing or disabled."""
    if not hasattr(os, "O_PATH"):
        return 0
    try:
        version = _libc().syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0),
                                  ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except (AttributeError, OSError):
        return 0
    return max(int(version), 0)


def _supported(abi: int) -> int:
    rights = READ | WRITE | IOCTL_DEV
    if abi < 2:
        rights &= ~REFER
    if abi < 3:
        rights &= ~TRUNCATE
    if abi < 5:
        rights &= ~IOCTL_DEV
    return rights


def features(abi: int) -> list[str]:
    """What `restrict` enforces on a kernel with Landlock ABI `abi`, in words."""
    out = ["files"] if abi >= 1 else []
    out += ["tcp"] if abi >= 4 else []
    out += ["device ioctl"] if abi >= 5 else []
    out += ["signals", "abstract unix sockets"] if abi >= 6 else []
    return out


def restrict(read: Iterable[str], write: Iterable[str], list_only: Iterable[str] = (), *,
             write_rights: int = WRITE, tcp: bool = True, devices: Iterable[str] = ()) -> int:
    """Allow reading below `read` and reading + writing below `write`; forbid the rest.

    `list_only` folders may be listed (names only, also of their subfolders) but no file in
    them read, unless `read` allows it: Python's import system lists a package's folder to find
    its modules, and listing a folder reveals no file's content. `devices` are device nodes
    the process may open to read, write and ioctl (ABI 5 handles ioctl on devices: without
    the right, NVIDIA's driver, which talks to the GPU through ioctls on /dev/nvidia*, is
    refused). `write_rights` narrows what
    the `write` paths allow (`WRITE_PLAIN`: no sockets, FIFOs, devices or links); ``tcp=False``
    refuses every TCP bind and connect (ABI 4+). From ABI 6 the process is also scoped: no
    signal to, and no abstract unix socket of, a process outside its domain.

    Returns the ABI version used. Paths that do not exist are skipped. Raises OSError when the
    kernel has no Landlock (check `abi_version()` first to fall back).
    """
    abi = abi_version()
    if abi < 1:
        raise OSError("Landlock is not available on this kernel")
    libc, handled = _libc(), _supported(abi)
    # From ABI 6 signals are scoped too: a rank (as root where no uid of its own could be
    # given) could otherwise SIGKILL any process on the host, e.g. kill(-1, SIGKILL); and
    # abstract unix sockets, which no file right covers (a hidden channel between ranks).
    net = (NET_BIND_TCP | NET_CONNECT_TCP) if abi >= 4 and not tcp else 0
    scoped = SCOPE_SIGNAL | SCOPE_ABSTRACT_UNIX_SOCKET if abi >= 6 else 0
    attr = _RulesetAttrScoped(handled, net, scoped) if (net or scoped) else _RulesetAttr(handled)
    ruleset = libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr),
                           ctypes.c_size_t(ctypes.sizeof(attr)),
                           ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        for paths, rights in ((list_only, READ_DIR), (read, READ), (write, READ | write_rights),
                              (devices, READ_FILE | WRITE_FILE | IOCTL_DEV)):
            for path in paths:
                _add_rule(libc, ruleset, path, rights & handled)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if libc.syscall(_SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)
    return abi


def _add_rule(libc: ctypes.CDLL, ruleset: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        if not os.path.isdir(path):
            rights &= _FILE_ONLY
        rule = _PathBeneathAttr(rights, fd)
        if libc.syscall(_SYS_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH),
                        ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
    finally:
        os.close(fd)


__all__ = ["READ", "WRITE", "WRITE_PLAIN", "abi_version", "features", "restrict"]
