"""Channel (red team 8, `fanotify`): unprivileged fanotify (Linux 5.13+) on a file every rank's
world binds: rank 0 marks /etc/os-release and counts the events it gets, rank 1 opens and reads
it, so a rank learns when another opens a file (and saw the host's own opens of a bound file);
mincore asks which pages of a shared file are cached. Expected: the seccomp filter refuses
fanotify_init, fanotify_mark and mincore (EPERM); rank 0 raises with what it got.
"""

import ctypes as _ctypes
import errno as _errno
import mmap as _mmap
import os as _os
import platform as _platform
import time as _time

_libc = _ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = _ctypes.c_long
_AARCH64 = _platform.machine() == "aarch64"
_FANOTIFY_INIT, _FANOTIFY_MARK, _MINCORE = (262, 263, 232) if _AARCH64 else (300, 301, 27)
_TARGET = "/etc/os-release"


def _call(number, *args):
    r = _libc.syscall(number, *args)
    return r if r >= 0 else _errno.errorcode[_ctypes.get_errno()]


def ring_all_reduce(tensor):  # noqa: F811
    if dist.get_rank() == 1:
        for _ in range(5):
            with open(_TARGET, "rb") as f:
                f.read(10)
        return
    got = {"fanotify_init": _call(_FANOTIFY_INIT, 0x200 | 2, 0)}  # FAN_REPORT_FID|FAN_NONBLOCK
    fd = got["fanotify_init"] if isinstance(got["fanotify_init"], int) else -1
    got["fanotify_mark"] = _call(_FANOTIFY_MARK, fd, 1, _ctypes.c_uint64(0x31), -100,
                                 _TARGET.encode())  # FAN_MARK_ADD: open, access, close
    _time.sleep(1.0)
    if fd >= 0:
        try:
            got["events"] = len(_os.read(fd, 65536))
        except OSError as e:
            got["events"] = _errno.errorcode[e.errno]
    with open(_TARGET, "rb") as f:
        page = _mmap.mmap(f.fileno(), 0, _mmap.MAP_SHARED, _mmap.PROT_READ)
        vec = _ctypes.create_string_buffer(8)
        got["mincore"] = _call(_MINCORE, _ctypes.c_void_p(_address(page)), _ctypes.c_size_t(1),
                               vec)
    raise RuntimeError(f"fanotify channel: {got}")


def _address(mm):
    """Where a read-only mapping starts (ctypes takes no read-only buffer; numpy does)."""
    import numpy as _np
    return _np.frombuffer(mm, dtype=_np.uint8).__array_interface__["data"][0]
