"""The channel the seccomp filter cannot refuse: the kernel's futex wake when a thread exits.

A thread's clear-tid address (``set_tid_address(2)``, or ``clone(CLONE_CHILD_CLEARTID)``) is
written with 0 and woken with ``FUTEX_WAKE`` by the kernel itself when the thread exits
(kernel/fork.c, ``mm_release``), without the shared/private choice a system call makes: on a
word of a MAP_SHARED mapping of a file, the wake is keyed by (inode, offset), so it reaches a
shared ``FUTEX_WAIT`` on the same word in any process that maps the file (every rank maps the
interpreter's libraries). The wake is no system call, so no seccomp filter sees it; the write
fails silently on a read-only mapping, which leaves the waiter's value unchanged.

Two processes under `autograder.sandbox.seccomp`'s filter (the ranks' own): the sender's
threads set their clear-tid address to one word of a read-only mapping of libtorch_cpu.so and
exit, one after another; the receiver waits on that word in a loop and counts its wakes. A
receiver with a thread waiting on each of 256 words would read a byte per wake.

Usage: python benchmarks/thread_exit_wakes.py [--seconds 3]
Rates follow the machine's load: read them as an order of magnitude.
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import platform
import threading
import time
from pathlib import Path

import numpy as np
import torch

from autograder.sandbox import seccomp

FUTEX, SET_TID_ADDRESS = (98, 96) if platform.machine() == "aarch64" else (202, 218)
FUTEX_WAIT = 0


class Timespec(ctypes.Structure):
    _fields_ = [("s", ctypes.c_long), ("ns", ctypes.c_long)]


def shared_word() -> tuple[mmap.mmap, np.ndarray, int]:
    """The first word of a read-only shared mapping of a library every rank maps (the mapping
    must outlive its use: a wake on an unmapped address reaches nobody)."""
    path = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 4096, mmap.MAP_SHARED, mmap.PROT_READ)
    word = np.frombuffer(mm, dtype=np.uint32, count=1)
    return mm, word, word.__array_interface__["data"][0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="how long to count (s)")
    args = parser.parse_args()
    load = os.getloadavg()[0]  # before the filter, which refuses sysinfo
    if not seccomp.install():
        raise SystemExit("the seccomp filter is not available on this machine")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    kept = shared_word()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the sender: one thread exit after another, for a second longer than counted
        os.close(read)
        exits, end = 0, time.monotonic() + args.seconds + 1.0
        while time.monotonic() < end:
            t = threading.Thread(target=libc.syscall,
                                 args=(SET_TID_ADDRESS, ctypes.c_void_p(kept[2])))
            t.start()
            t.join()
            exits += 1
        os.write(write, f"{exits / (args.seconds + 1.0):.0f}".encode())
        os._exit(0)
    os.close(write)
    word, addr = kept[1], ctypes.c_void_p(kept[2])
    tenth, woken, end = Timespec(0, 100_000_000), 0, time.monotonic() + args.seconds
    while time.monotonic() < end:
        woken += libc.syscall(FUTEX, addr, FUTEX_WAIT, ctypes.c_uint32(int(word[0])),
                              ctypes.byref(tenth), None, 0) == 0
    os.waitpid(pid, 0)
    exits = int(os.read(read, 64))
    print(f"load average {load:.1f}, {os.cpu_count()} cores, both processes "
          f"under the ranks' seccomp filter")
    print(f"sender: {exits:,} thread exits per second")
    print(f"receiver: {woken / args.seconds:,.0f} wakes per second (one waiting thread); at a "
          f"byte per wake (256 waiting threads, not measured here) that would be "
          f"{8 * woken / args.seconds / 1000:,.1f} kbit/s")


if __name__ == "__main__":
    main()
