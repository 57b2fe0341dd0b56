"""Record every message a rank sends or receives through `torch.distributed`.

Lessons draw real runs from it, the autograder checks *how* work was done with it, tests assert
byte counts with it. Two ways to use it, same API:

In the parent (a notebook cell or a script), around a launch; every rank records and the merged
trace is filled in when the launch returns::

    from toolkit import comm
    from toolkit.launch import spawn

    with comm.recording() as trace:
        spawn(work, world_size=4)
    trace.to_frame()          # one row per call: rank, op, peer, nbytes, dtype, start, end
    trace.totals()[0].bytes_sent

Inside a rank, around the part you want to measure::

    def work(rank, world_size):
        with comm.recording() as trace:
            dist.all_reduce(t)
        return trace.totals()[rank].collective_bytes

Importing this package changes nothing. `install()` wraps `torch.distributed`'s communication
functions (see `toolkit.comm.patch` for what is and is not seen); it is called where calls must
be seen: in every rank the launcher starts (before user code runs), by `init_from_env` under
torchrun, and by `recording()`. (The grader does not install it: its courier carries and
counts every byte between ranks.) With no recording active the
wrapper costs a fraction of a microsecond per call; `benchmarks/launch_overhead.py` measures it.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from .events import P2P_OPS, Event, Message, RankTotals, Trace
from .inflight import InflightBoard, InflightOp
from .patch import (
    RecordedWork,
    active_traces,
    attach,
    detach,
    install,
    is_installed,
    original,
    start_recording,
    stop_recording,
    uninstall,
)

DEFAULT_MAX_EVENTS = 200_000
"""Events one recording keeps per process (about 30 MB); later ones are counted in `dropped`."""


@contextmanager
def recording(*, max_events: int = DEFAULT_MAX_EVENTS, values: int = 0) -> Iterator[Trace]:
    """Record communication calls made while the block runs; yields the `Trace` it fills.

    In a rank, the trace holds this rank's calls. In the parent, `toolkit.launch.spawn` asks
    every rank to record and adds their calls to the trace when the launch returns.

    ``values=k`` also keeps the elements of every send of at most k elements (`Event.values`),
    for drawing what was sent (partial sums of a ring all-reduce); copying them costs time, so
    keep k small (a few dozen).
    """
    if max_events < 0:
        raise ValueError(f"recording(max_events=...) must be >= 0, got {max_events}")
    if values < 0:
        raise ValueError(f"recording(values=...) must be >= 0 (elements per send), got {values}")
    install()
    trace = Trace()
    start_recording(trace, max_events, values)
    try:
        yield trace
    finally:
        stop_recording(trace)


__all__ = [
    "DEFAULT_MAX_EVENTS",
    "Event",
    "InflightBoard",
    "InflightOp",
    "Message",
    "P2P_OPS",
    "RankTotals",
    "RecordedWork",
    "Trace",
    "active_traces",
    "attach",
    "detach",
    "install",
    "is_installed",
    "original",
    "recording",
    "uninstall",
]
