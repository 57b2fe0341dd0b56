"""What ranks print, shown in the parent line by line with the rank in front.

Ranks write to pipes (their file descriptors 1 and 2, so C++ output such as gloo or NCCL
warnings is caught too); the parent reads them on its main thread, which in Jupyter is the one
whose output lands in the running cell. A flood of output is capped so that a notebook stays
usable, and the last lines of each rank are kept for error messages.
"""

from __future__ import annotations

import codecs
import sys
from collections import deque

STREAMS = ("out", "err")


class OutputPump:
    """Splits each rank's bytes into lines, echoes them tagged, keeps a tail for errors."""

    def __init__(self, world_size: int, *, echo: bool, max_echo_bytes: int = 1 << 20,
                 tail_lines: int = 40) -> None:
        self.echo = echo
        self.max_echo_bytes = max_echo_bytes
        self._decoders = {(r, s): codecs.getincrementaldecoder("utf-8")(errors="replace")
                          for r in range(world_size) for s in STREAMS}
        self._partial = {(r, s): "" for r in range(world_size) for s in STREAMS}
        self._echoed = [0] * world_size
        self._muted = [False] * world_size
        self._tail: list[deque[str]] = [deque(maxlen=tail_lines) for _ in range(world_size)]
        self.total_bytes = [0] * world_size

    def feed(self, rank: int, stream: str, data: bytes) -> None:
        self.total_bytes[rank] += len(data)
        text = self._partial[rank, stream] + self._decoders[rank, stream].decode(data)
        *lines, self._partial[rank, stream] = text.split("\n")
        for line in lines:
            self._line(rank, stream, line)

    def flush(self) -> None:
        """Emit partial last lines (output that did not end in a newline)."""
        for (rank, stream), rest in self._partial.items():
            rest += self._decoders[rank, stream].decode(b"", final=True)
            if rest:
                self._line(rank, stream, rest)
            self._partial[rank, stream] = ""
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except (OSError, ValueError):
                pass

    def tail(self, rank: int) -> str:
        """The last lines rank `rank` printed, stdout and stderr interleaved as read."""
        return "\n".join(self._tail[rank])

    def _line(self, rank: int, stream: str, line: str) -> None:
        self._tail[rank].append(line)
        if not self.echo or self._muted[rank]:
            return
        self._echoed[rank] += len(line) + 1
        target = sys.stderr if stream == "err" else sys.stdout
        if self._echoed[rank] > self.max_echo_bytes:
            self._muted[rank] = True
            target.write(f"[rank {rank}] ... more output not shown "
                         f"(over {self.max_echo_bytes:,} bytes; spawn(echo=False) hides it all)\n")
            return
        target.write(f"[rank {rank}] {line}\n")
