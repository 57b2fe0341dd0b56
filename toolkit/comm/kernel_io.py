"""Bytes a process handed to the kernel to write: ``wchar`` of ``/proc/self/io`` (Linux, proc(5)).

Every write to a socket, pipe or file counts, whoever makes it: Python, or C++ such as gloo's
transport under torch DDP's reducer, which no Python wrapper sees. The difference of two readings
taken around some work is what the process wrote meanwhile: a 4 MiB gloo send adds the 4 MiB
and gloo's headers (96 bytes more, measured here; `tests/test_kernel_io.py` allows a few KB).
Lesson 16 sets it beside the recorder. (The grader does not need it: its courier carries every
byte between ranks itself.)
"""

from __future__ import annotations

__all__ = ["written_bytes"]


def written_bytes() -> int | None:
    """Bytes this process has written so far (``wchar``), or None where there is no /proc."""
    try:
        with open("/proc/self/io", "rb") as f:
            for line in f:
                if line.startswith(b"wchar:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None
