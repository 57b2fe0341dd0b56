"""A board in shared memory where each rank posts the communication call it is in right now.

When a launch hangs, the ranks are stuck inside C++ (a gloo recv, an NCCL kernel) and cannot
answer questions; the parent reads this board instead and can say "rank 3 has been in
all_reduce (4 bytes, float32) for 9.8 s". Posting is a `struct.pack_into` on an mmap'd file:
about a microsecond, cheap enough to stay on even when recording is off.

One fixed-size slot per rank; a rank only ever writes its own slot, the parent only reads.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from dataclasses import dataclass

# start, end (0 while in flight), seq, peer (-1 = none), nbytes, op name, dtype name
_SLOT = struct.Struct("<ddqqq32s16s")
_NO_PEER = -1


@dataclass(frozen=True)
class InflightOp:
    """What a rank's slot says."""

    op: str
    peer: int | None
    nbytes: int
    dtype: str
    start: float
    end: float | None
    seq: int

    @property
    def active(self) -> bool:
        return self.end is None

    def describe(self, now: float | None = None) -> str:
        """E.g. ``"in recv from rank 0 (4,000 bytes, float32) for 9.8 s"``."""
        now = time.time() if now is None else now
        what = self.op
        if self.peer is not None:
            direction = "to" if self.op in ("send", "isend") else "from"
            if self.op in ("send", "isend", "recv", "irecv") or self.op.endswith(".wait"):
                what += f" {direction} rank {self.peer}"
            else:
                what += f" (root {self.peer})"
        detail = f"{self.nbytes:,} bytes" + (f", {self.dtype}" if self.dtype else "")
        if self.active:
            return f"in {what} ({detail}) for {now - self.start:.1f} s"
        return (f"not in a communication call; its last one, {what} ({detail}), ended "
                f"{now - self.end:.1f} s ago")


class InflightBoard:
    """Slots for `world_size` ranks in a file that the parent creates and the ranks map."""

    def __init__(self, path: str, world_size: int, *, create: bool = False) -> None:
        self.path = path
        self.world_size = world_size
        size = _SLOT.size * world_size
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            self._mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)

    def post(self, rank: int, seq: int, op: str, peer: int | None, nbytes: int, dtype: str) -> None:
        """Rank `rank` has entered `op`."""
        _SLOT.pack_into(self._mm, rank * _SLOT.size, time.time(), 0.0, seq,
                        _NO_PEER if peer is None else peer, nbytes,
                        op.encode()[:32], dtype.encode()[:16])

    def done(self, rank: int) -> None:
        """Rank `rank` has left the op it posted (writes only the `end` field)."""
        struct.pack_into("<d", self._mm, rank * _SLOT.size + 8, time.time())

    def read(self, rank: int) -> InflightOp | None:
        """The slot of `rank`, or None if it never posted."""
        start, end, seq, peer, nbytes, op, dtype = _SLOT.unpack_from(self._mm, rank * _SLOT.size)
        if start == 0.0:
            return None
        return InflightOp(
            op=op.rstrip(b"\0").decode(errors="replace"),
            peer=None if peer == _NO_PEER else peer,
            nbytes=nbytes,
            dtype=dtype.rstrip(b"\0").decode(errors="replace"),
            start=start,
            end=None if end == 0.0 else end,
            seq=seq,
        )

    def close(self) -> None:
        try:
            self._mm.close()
        except (BufferError, ValueError):
            pass
