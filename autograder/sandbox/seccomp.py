"""A seccomp filter for ranks: the system calls that would open a channel no file rule covers.

Landlock confines files, TCP, signals and abstract unix sockets; the network and IPC
namespaces give each rank its own. What neither sees, and the filter refuses with EPERM
(seccomp(2), ``SECCOMP_RET_ERRNO``), found by attacking the sandbox:

* kernel keyrings (``add_key``/``request_key``/``keyctl``): every process of one uid shares
  its user keyring, so two ranks could pass bytes through it;
* locks and notifications on files both ranks may read (``flock``; ``fcntl`` record locks,
  leases and directory notices; ``inotify``): a rank locks or reads a library file, the
  other watches;
* ``socket`` (every family: the rank's one channel already exists), System V and POSIX
  message queues, semaphores and shared memory (a second layer under the IPC namespace);
* new namespaces (``unshare``, ``setns``, ``clone`` with a ``CLONE_NEW*`` flag; ``clone3``
  answers ENOSYS so the C library falls back to ``clone``), ``io_uring`` (it can open
  sockets without calling ``socket``), ``ptrace``, ``process_vm_readv/writev``,
  ``pidfd_getfd``, ``perf_event_open``, ``bpf``, ``userfaultfd``;
* metadata: ``chmod``, ``chown``, ``utime`` and ``setxattr``/``removexattr`` in every form
  (fd, path, ``*at``, ``fchmodat2``, ``setxattrat``, ``file_setattr``). A rank's world refuses
  them already outside its $HOME (read-only mounts: EROFS; files it does not own: EPERM), and
  within its $HOME they reach nobody; refused here too, they cannot become a channel or a
  privilege however a mount is set up. The second red team of issue 30 made a root-owned
  binary setuid from a rank that ran as uid 0, and passed gradients between ranks through
  extended attributes;
* mounts: ``mount``, ``umount2``, ``pivot_root``, ``chroot`` and the new mount API
  (``open_tree``, ``move_mount``, ``fsopen``, ``fsconfig``, ``fsmount``, ``fspick``,
  ``mount_setattr``, ``open_tree_attr``): a rank has no capability to use them, and none may
  change its world once built;
* the shared page cache, as far as it is cheap to use (both ranks read the same library
  files): evicting a file's pages (``fadvise64``; ``madvise`` ``MADV_COLD`` and
  ``MADV_PAGEOUT``), asking which are cached (``cachestat``; ``preadv2`` with ``RWF_NOWAIT``).
  Tried while building issue 30's worlds: rank 1 evicted and re-read pages of a file both bind,
  rank 0 asked which were cached. Reading a page and timing a read remain (docs/grading.md,
  "What it does not stop");
* ``sysinfo``: the host's free memory and number of processes, both of which one rank can
  move and another read;
* ``fanotify`` (``fanotify_init``, ``fanotify_mark``): unprivileged since Linux 5.13, it tells
  a rank when another process opens a file both can see (red team 8: rank 0 saw rank 1 open
  /etc/os-release, and the host's own opens of a bound file); ``mincore`` likewise asks which
  pages of a shared file are cached;
* shared futexes: every rank maps the same library files (one inode each), and a futex on a
  word of such a mapping is keyed by (inode, offset), so ``FUTEX_WAIT`` in one rank and
  ``FUTEX_WAKE`` in another met in the kernel: red team 8 moved lab 06's gradients that way and
  scored 100 with all-reduces of zeros. Only private futex operations are allowed
  (``FUTEX_PRIVATE_FLAG`` set: the key is the process's own address space, as every thread
  library uses within a process); ``futex_waitv`` and the futex2 calls, whose flags sit in
  memory or in other arguments, answer ENOSYS;
* calls that act on another process by pid (ranks may run as the grader's own uid, where the
  kernel lets one process of a uid change another's): ``pidfd_open``, ``pidfd_send_signal``,
  ``process_madvise``, ``process_mrelease``, ``kcmp``, ``ioprio_set``, and ``prlimit64``,
  ``sched_setscheduler``, ``sched_setparam``, ``sched_setattr``, ``migrate_pages``,
  ``move_pages`` unless their pid is 0 (the caller). The red team lowered the grader's
  RLIMIT_CPU from a rank with ``prlimit`` and the grader died of SIGXCPU.

A 32-bit or x32 system call (another table, where these numbers mean other calls) is refused
outright. Numbers are given for x86_64 and aarch64; elsewhere `install` returns False and the
grade's report says the filter is missing.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
# name -> (x86_64, aarch64); None where the call does not exist on that architecture.
_CALLS = {
    "socket": (41, 198), "flock": (73, 32), "unshare": (272, 97), "setns": (308, 268),
    "shmget": (29, 194), "shmat": (30, 196), "shmctl": (31, 195), "shmdt": (67, 197),
    "semget": (64, 190), "semop": (65, 193), "semctl": (66, 191), "semtimedop": (220, 192),
    "msgget": (68, 186), "msgsnd": (69, 189), "msgrcv": (70, 188), "msgctl": (71, 187),
    "mq_open": (240, 180), "mq_unlink": (241, 181), "mq_timedsend": (242, 182),
    "mq_timedreceive": (243, 183), "mq_notify": (244, 184), "mq_getsetattr": (245, 185),
    "add_key": (248, 217), "request_key": (249, 218), "keyctl": (250, 219),
    "inotify_init": (253, None), "inotify_init1": (294, 26), "inotify_add_watch": (254, 27),
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "perf_event_open": (298, 241), "bpf": (321, 280), "userfaultfd": (323, 282),
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "pidfd_getfd": (438, 438), "pidfd_open": (434, 434), "pidfd_send_signal": (424, 424),
    "process_madvise": (440, 440), "process_mrelease": (448, 448), "kcmp": (312, 272),
    "ioprio_set": (251, 30),
    # metadata (aarch64 has only the *at forms)
    "chmod": (90, None), "fchmod": (91, 52), "fchmodat": (268, 53), "fchmodat2": (452, 452),
    "chown": (92, None), "fchown": (93, 55), "lchown": (94, None), "fchownat": (260, 54),
    "utime": (132, None), "utimes": (235, None), "futimesat": (261, None),
    "utimensat": (280, 88), "setxattr": (188, 5), "lsetxattr": (189, 6), "fsetxattr": (190, 7),
    "removexattr": (197, 14), "lremovexattr": (198, 15), "fremovexattr": (199, 16),
    "setxattrat": (463, 463), "removexattrat": (466, 466), "file_setattr": (469, 469),
    # mounts
    "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41), "chroot": (161, 51),
    "open_tree": (428, 428), "move_mount": (429, 429), "fsopen": (430, 430),
    "fsconfig": (431, 431), "fsmount": (432, 432), "fspick": (433, 433),
    "mount_setattr": (442, 442), "open_tree_attr": (467, 467),
    # host-wide state one rank can move and another read
    "fadvise64": (221, 223), "cachestat": (451, 451), "sysinfo": (99, 179),
    "fanotify_init": (300, 262), "fanotify_mark": (301, 263), "mincore": (27, 232),
}
# futex2 system calls (Linux 5.16/6.7): refused as absent, so a library falls back to futex.
_ENOSYS = {"futex_waitv": (449, 449), "futex_wake": (454, 454), "futex_wait": (455, 455),
           "futex_requeue": (456, 456)}
# name -> (x86_64, aarch64): allowed on the caller only (first argument, the pid, is 0).
_SELF_ONLY = {
    "prlimit64": (302, 261), "sched_setscheduler": (144, 119), "sched_setparam": (142, 118),
    "sched_setattr": (314, 274), "migrate_pages": (256, 238), "move_pages": (279, 239),
}
_FCNTL, _CLONE, _CLONE3 = (72, 25), (56, 220), (435, 435)
_FUTEX, _FUTEX_PRIVATE_FLAG, _FUTEX_CMD_MASK = (202, 98), 128, 127
_FUTEX_WAIT, _FUTEX_WAIT_BITSET = 0, 9
_MADVISE, _PREADV2 = (28, 233), (327, 286)
_MADV_REFUSED = (20, 21)  # MADV_COLD, MADV_PAGEOUT
_RWF_NOWAIT = 0x8
# fcntl commands: record locks (F_GETLK..F_SETLKW, the OFD forms), leases, directory notices.
_FCNTL_REFUSED = (5, 6, 7, 36, 37, 38, 1024, 1025, 1026)
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET | NEWTIME
_CLONE_NEW = 0x7E020080

_LD_W_ABS, _JEQ, _JGE, _JSET, _RET, _ALU_AND = 0x20, 0x15, 0x35, 0x45, 0x06, 0x54
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000
# struct seccomp_data: nr, arch, then the arguments' low words (little-endian) at 16 + 8·i
_NR, _ARCH_OFF, _ARG0, _ARG1, _ARG2, _ARG5 = 0, 4, 16, 24, 32, 56


def _ins(code: int, jt: int = 0, jf: int = 0, k: int = 0) -> tuple[int, int, int, int]:
    return code, jt, jf, k


def program(machine: str | None = None) -> list[tuple[int, int, int, int]] | None:
    """The filter's BPF instructions for `machine` (default: this one), or None."""
    machine = machine or platform.machine()
    if machine not in _ARCH:
        return None
    col = 0 if machine == "x86_64" else 1
    deny = _ins(_RET, k=_ERRNO | errno.EPERM)
    out = [_ins(_LD_W_ABS, k=_ARCH_OFF), _ins(_JEQ, 1, 0, _ARCH[machine]), deny,
           _ins(_LD_W_ABS, k=_NR)]
    if machine == "x86_64":  # x32 system calls share the architecture value
        out += [_ins(_JGE, 0, 1, 0x40000000), deny]
    for numbers in _CALLS.values():
        if numbers[col] is not None:
            out += [_ins(_JEQ, 0, 1, numbers[col]), deny]
    self_only = [_ins(_LD_W_ABS, k=_ARG0), _ins(_JEQ, 1, 0, 0), deny, _ins(_LD_W_ABS, k=_NR)]
    for numbers in _SELF_ONLY.values():
        out += [_ins(_JEQ, 0, len(self_only), numbers[col])] + self_only
    fcntl = [_ins(_LD_W_ABS, k=_ARG1)]
    for cmd in _FCNTL_REFUSED:
        fcntl += [_ins(_JEQ, 0, 1, cmd), deny]
    fcntl.append(_ins(_LD_W_ABS, k=_NR))
    out += [_ins(_JEQ, 0, len(fcntl), _FCNTL[col])] + fcntl
    madvise = [_ins(_LD_W_ABS, k=_ARG2)]
    for advice in _MADV_REFUSED:
        madvise += [_ins(_JEQ, 0, 1, advice), deny]
    madvise.append(_ins(_LD_W_ABS, k=_NR))
    out += [_ins(_JEQ, 0, len(madvise), _MADVISE[col])] + madvise
    nowait = [_ins(_LD_W_ABS, k=_ARG5), _ins(_JSET, 0, 1, _RWF_NOWAIT), deny,
              _ins(_LD_W_ABS, k=_NR)]
    out += [_ins(_JEQ, 0, len(nowait), _PREADV2[col])] + nowait
    # futex: private operations, and shared waits (pthread_join waits on a thread's tid with a
    # shared FUTEX_WAIT, matching the kernel's shared wake at thread exit); no shared wake.
    allow = _ins(_RET, k=_ALLOW)
    futex = [_ins(_LD_W_ABS, k=_ARG1), _ins(_JSET, 4, 0, _FUTEX_PRIVATE_FLAG),
             _ins(_ALU_AND, k=_FUTEX_CMD_MASK), _ins(_JEQ, 2, 0, _FUTEX_WAIT),
             _ins(_JEQ, 1, 0, _FUTEX_WAIT_BITSET), deny, allow]
    out += [_ins(_JEQ, 0, len(futex), _FUTEX[col])] + futex
    for numbers in _ENOSYS.values():
        out += [_ins(_JEQ, 0, 1, numbers[col]), _ins(_RET, k=_ERRNO | errno.ENOSYS)]
    clone = [_ins(_LD_W_ABS, k=_ARG0), _ins(_JSET, 0, 1, _CLONE_NEW), deny, _ins(_LD_W_ABS, k=_NR)]
    out += [_ins(_JEQ, 0, len(clone), _CLONE[col])] + clone
    out += [_ins(_JEQ, 0, 1, _CLONE3[col]), _ins(_RET, k=_ERRNO | errno.ENOSYS)]
    out.append(_ins(_RET, k=_ALLOW))
    return out


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install() -> bool:
    """Load the filter into this process (and everything it starts). Needs no_new_privs or
    CAP_SYS_ADMIN; returns False where the architecture is unknown or the kernel refuses."""
    ins = program()
    if ins is None:
        return False
    raw = b"".join(struct.pack("<HBBI", *i) for i in ins)
    buf = ctypes.create_string_buffer(raw, len(raw))
    prog = _Prog(len(ins), ctypes.cast(buf, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
    return libc.prctl(22, 2, ctypes.byref(prog), 0, 0) == 0  # PR_SET_SECCOMP, MODE_FILTER


__all__ = ["install", "program"]
