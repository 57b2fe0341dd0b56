"""The recorder's state in one object: what the wrappers in `toolkit.comm.patch` write into.

One `Recorder` per process (`RECORDER`) holds the functions the wrappers replaced, the active
recordings (each a `Trace` with its own caps), the rank and in-flight board the launcher
attached, the per-process call counter and the per-thread nesting depth (a call made inside a
recorded call is not recorded again).

Caps are per recording: ``recording(max_events=k, values=v)`` keeps at most k events per
process and the elements of sends of at most v elements, whatever other recordings open at the
same time ask for; what a recording cannot keep is counted in its ``Trace.dropped``. In the
parent, `deliver` hands each recording the events the ranks sent back under the same caps
(k per rank), and adds what the ranks themselves dropped.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from dataclasses import dataclass
from typing import Callable, Iterable

from .events import Event, Trace
from .inflight import InflightBoard


class _ThreadState(threading.local):
    depth = 0  # > 0 while inside a wrapped call on this thread


@dataclass
class _Sink:
    """One active recording and its own limits."""

    trace: Trace
    max_events: int
    """Events it keeps per process (per rank, in the parent); later ones count as dropped."""
    values: int
    """Largest send (elements) whose values it keeps; 0: none."""

    def keep(self, event: Event) -> Event:
        """`event` as this recording keeps it: without values beyond its own cap."""
        if event.values is not None and len(event.values) > self.values:
            return dataclasses.replace(event, values=None)
        return event


class Recorder:
    """Everything the wrappers share in one process (module docstring)."""

    def __init__(self) -> None:
        self.originals: dict[str, Callable] = {}
        """Name -> the torch function a wrapper replaced (empty: not installed)."""
        self.sinks: list[_Sink] = []
        """Active recordings in this process, oldest first."""
        self.board: InflightBoard | None = None
        """Where a launched rank posts the call it is in (None outside `spawn`'s ranks)."""
        self.rank: int | None = None
        """Set by the launcher; else asked of torch.distributed at each call."""
        self.seq = itertools.count()
        """Numbers this process's calls 0, 1, 2, ... (`Event.seq`)."""
        self.tls = _ThreadState()

    def attach(self, rank: int, board: InflightBoard | None) -> None:
        self.rank, self.board = rank, board

    def detach(self) -> None:
        self.rank, self.board = None, None

    # -- recordings --------------------------------------------------------------------------
    def start(self, trace: Trace, max_events: int, values: int = 0) -> None:
        self.sinks.append(_Sink(trace, max_events, values))

    def stop(self, trace: Trace) -> None:
        self.sinks = [s for s in self.sinks if s.trace is not trace]
        trace.events.sort(key=lambda e: (e.start, e.rank, e.seq))

    @property
    def values_limit(self) -> int:
        """The largest send whose elements some active recording keeps (0: none)."""
        return max((s.values for s in self.sinks), default=0)

    @property
    def events_limit(self) -> int | None:
        """The most events some active recording keeps (None: no recording)."""
        return max((s.max_events for s in self.sinks), default=None)

    def add(self, event: Event) -> list[Event]:
        """Hand `event` to every active recording; returns the copies they kept (an async
        call's `RecordedWork` sets their end time)."""
        kept = []
        for sink in self.sinks:
            if len(sink.trace.events) >= sink.max_events:
                sink.trace.dropped += 1
                continue
            kept.append(sink.keep(event))
            sink.trace.events.append(kept[-1])
        return kept

    def deliver(self, events: Iterable[Event], dropped: int = 0,
                traces: Iterable[Trace] | None = None) -> None:
        """In the parent, after a launch: the ranks' events into every active recording (or
        those of `traces`), each keeping at most its own `max_events` per rank and its own
        values cap; `dropped` (what the ranks could not keep) is added to each one's count."""
        by_rank: dict[int, list[Event]] = {}
        for e in events:
            by_rank.setdefault(e.rank, []).append(e)
        chosen = None if traces is None else {id(t) for t in traces}
        for sink in self.sinks:
            if chosen is not None and id(sink.trace) not in chosen:
                continue
            kept = [sink.keep(e) for mine in by_rank.values() for e in mine[:sink.max_events]]
            sink.trace.dropped += dropped + sum(max(0, len(mine) - sink.max_events)
                                                for mine in by_rank.values())
            sink.trace.extend(kept)


RECORDER = Recorder()
"""This process's recorder."""

__all__ = ["RECORDER", "Recorder"]
