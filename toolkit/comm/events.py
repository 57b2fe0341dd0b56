"""What the recorder captures: one `Event` per communication call, and a `Trace` of many.

An event is one call a rank made through `torch.distributed` (send, recv, all_reduce, ...).
Byte counts follow one rule so that totals can be checked against the theory:

* point-to-point (send/isend/recv/irecv): ``nbytes`` is the payload that went over the wire,
  ``numel * element_size`` of the tensor, exact.
* collectives: ``nbytes`` is what this rank *passes in*: the input tensor(s) it contributes
  (broadcast: the tensor, on every rank; scatter: the whole scatter list on the source, 0
  elsewhere; all_gather: the input tensor; reduce_scatter: the whole input). How many bytes the
  backend then moves depends on its algorithm, which Python cannot see; the toolkit's own
  collectives (built from send/recv) are recorded message by message, exactly.

Times are wall-clock seconds since the epoch (`time.time()`), so events from ranks on one host
line up; `Trace.relative()` shifts them to start at 0.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Iterable, Iterator

P2P_SEND_OPS = frozenset({"send", "isend"})
P2P_RECV_OPS = frozenset({"recv", "irecv"})
P2P_OPS = P2P_SEND_OPS | P2P_RECV_OPS


@dataclass(slots=True)
class Event:
    """One communication call made by one rank."""

    rank: int
    """Global rank that made the call."""
    seq: int
    """Position of the call among this rank's recorded calls (0, 1, 2, ...)."""
    op: str
    """Name of the `torch.distributed` function: ``"send"``, ``"all_reduce"``, ..."""
    peer: int | None
    """Point-to-point: the other rank (global). Rooted collectives (broadcast, reduce, scatter,
    gather): the root. Otherwise None."""
    nbytes: int
    """Bytes, by the rule in the module docstring."""
    dtype: str
    """Element type of the (first) tensor, e.g. ``"float32"``; ``""`` when there is none."""
    shape: tuple[int, ...]
    """Shape of the (first) tensor."""
    start: float
    """When the call began (seconds since the epoch)."""
    end: float | None
    """When it finished: for async calls, when ``wait()`` returned; None if never waited on."""
    group: tuple[int, ...] | None = None
    """Global ranks of the process group, or None for the default (whole world) group."""
    async_op: bool = False
    """True for isend/irecv and collectives called with ``async_op=True``."""
    offset: int = 0
    """Point-to-point: the tensor's ``storage_offset()``, in elements from the start of its
    *storage* (not of any view the caller thinks of as "the tensor"), i.e. which slice of a
    larger buffer was sent. Differences between a rank's offsets locate chunks (a ring
    all-reduce's sends); a receive into a scratch buffer says nothing. 0 for collectives."""
    values: tuple | None = None
    """Sends only, when the recording asked for values (``recording(values=k)``) and the tensor has
    at most k elements: the elements sent, flattened. Lessons animate partial sums from them."""

    @property
    def kind(self) -> str:
        """``"p2p"`` for send/recv and their async forms, ``"collective"`` for the rest."""
        return "p2p" if self.op in P2P_OPS else "collective"

    @property
    def duration(self) -> float | None:
        """Seconds from start to end, or None if the call never completed."""
        return None if self.end is None else self.end - self.start

    def as_tuple(self) -> tuple:
        """Compact form for shipping between processes (field order of the dataclass)."""
        return tuple(getattr(self, f.name) for f in fields(self))

    @classmethod
    def from_tuple(cls, values: Iterable[Any]) -> "Event":
        return cls(*values)


@dataclass(slots=True)
class RankTotals:
    """Traffic of one rank, summed over a trace."""

    rank: int
    bytes_sent: int = 0
    """Bytes this rank sent point-to-point (send + isend)."""
    bytes_received: int = 0
    """Bytes this rank received point-to-point (recv + irecv)."""
    messages_sent: int = 0
    messages_received: int = 0
    collective_bytes: int = 0
    """Bytes passed into collectives (see the module docstring)."""
    calls: dict[str, int] = field(default_factory=dict)
    """Number of calls per op name."""


class Trace:
    """An ordered collection of events, from one rank or merged from many.

    `toolkit.comm.recording()` yields one; `toolkit.launch.spawn` fills it with every rank's
    events when the launch ends. Iterate it, index it, filter it, or turn it into a table.
    """

    def __init__(self, events: Iterable[Event] = ()) -> None:
        self.events: list[Event] = list(events)
        self.dropped: int = 0
        """Events not kept because a rank hit its cap (totals of kept events only)."""

    def __len__(self) -> int:
        return len(self.events)

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)

    def __getitem__(self, i: int) -> Event:
        return self.events[i]

    def __repr__(self) -> str:
        ranks = sorted({e.rank for e in self.events})
        return f"Trace({len(self.events)} events from ranks {ranks})"

    def extend(self, events: Iterable[Event]) -> None:
        """Add events and keep the trace in time order (ties broken by rank, then seq)."""
        self.events.extend(events)
        self.events.sort(key=lambda e: (e.start, e.rank, e.seq))

    # -- selections -------------------------------------------------------------------------
    def where(self, *, rank: int | None = None, op: str | Iterable[str] | None = None) -> "Trace":
        """The events of one rank and/or of the given op name(s)."""
        ops = {op} if isinstance(op, str) else (set(op) if op is not None else None)
        return Trace(
            e for e in self.events
            if (rank is None or e.rank == rank) and (ops is None or e.op in ops)
        )

    @property
    def ranks(self) -> list[int]:
        return sorted({e.rank for e in self.events})

    # -- summaries --------------------------------------------------------------------------
    def totals(self) -> dict[int, RankTotals]:
        """Per-rank bytes and message counts, keyed by rank."""
        out: dict[int, RankTotals] = {}
        for e in self.events:
            t = out.setdefault(e.rank, RankTotals(rank=e.rank))
            t.calls[e.op] = t.calls.get(e.op, 0) + 1
            if e.op in P2P_SEND_OPS:
                t.bytes_sent += e.nbytes
                t.messages_sent += 1
            elif e.op in P2P_RECV_OPS:
                t.bytes_received += e.nbytes
                t.messages_received += 1
            else:
                t.collective_bytes += e.nbytes
        return dict(sorted(out.items()))

    def op_counts(self) -> Counter:
        """How many calls of each op, over all ranks."""
        return Counter(e.op for e in self.events)

    def relative(self) -> "Trace":
        """A copy whose times count seconds from the first event's start."""
        if not self.events:
            return Trace()
        t0 = min(e.start for e in self.events)
        shifted = []
        for e in self.events:
            d = asdict(e)
            d["start"] -= t0
            d["end"] = None if e.end is None else e.end - t0
            shifted.append(Event(**d))
        return Trace(shifted)

    def to_records(self) -> list[dict[str, Any]]:
        """One dict per event, with ``kind`` and ``duration`` added."""
        rows = []
        for e in self.events:
            d = asdict(e)
            d["kind"] = e.kind
            d["duration"] = e.duration
            rows.append(d)
        return rows

    def to_frame(self, *, relative: bool = True):
        """A pandas DataFrame, one row per event; times from the first event when ``relative``."""
        import pandas as pd

        trace = self.relative() if relative else self
        columns = ["rank", "seq", "op", "kind", "peer", "nbytes", "dtype", "shape",
                   "start", "end", "duration", "group", "async_op", "offset", "values"]
        df = pd.DataFrame(trace.to_records(), columns=columns)
        df["peer"] = df["peer"].astype("Int64")  # a rank number or <NA>, not 1.0 / NaN
        return df

    def messages(self) -> list["Message"]:
        """Point-to-point messages, each send paired with the receive that got it.

        The k-th send from rank a to rank b is matched with the k-th receive on b from a (MPI's
        and gloo's non-overtaking order for one pair, one tag). Unmatched halves (a trace of one
        rank, a failed run) come with the other side's fields set to None.
        """
        sends: dict[tuple[int, int], list[Event]] = {}
        recvs: dict[tuple[int, int], list[Event]] = {}
        for e in sorted(self.events, key=lambda e: (e.rank, e.seq)):
            if e.peer is None:
                continue
            if e.op in P2P_SEND_OPS:
                sends.setdefault((e.rank, e.peer), []).append(e)
            elif e.op in P2P_RECV_OPS:
                recvs.setdefault((e.peer, e.rank), []).append(e)
        out = []
        for pair in sorted(set(sends) | set(recvs)):
            ss, rr = sends.get(pair, []), recvs.get(pair, [])
            for k in range(max(len(ss), len(rr))):
                s = ss[k] if k < len(ss) else None
                r = rr[k] if k < len(rr) else None
                out.append(Message(src=pair[0], dst=pair[1], index=k, send=s, recv=r))
        out.sort(key=lambda m: (m.start, m.src, m.dst))
        return out

    def totals_frame(self):
        """A pandas DataFrame of `totals()`, one row per rank."""
        import pandas as pd

        rows = []
        for t in self.totals().values():
            d = asdict(t)
            d["calls"] = ", ".join(f"{k}×{v}" for k, v in sorted(t.calls.items()))
            rows.append(d)
        return pd.DataFrame(rows).set_index("rank") if rows else pd.DataFrame()


@dataclass(slots=True)
class Message:
    """One point-to-point message: the send event and the matching receive event."""

    src: int
    dst: int
    index: int
    """How many earlier messages went from `src` to `dst` in this trace."""
    send: Event | None
    recv: Event | None

    @property
    def nbytes(self) -> int:
        return (self.send or self.recv).nbytes

    @property
    def start(self) -> float:
        """When the first side of the message was posted."""
        return min(e.start for e in (self.send, self.recv) if e is not None)

    @property
    def end(self) -> float | None:
        """When the receiver had the data (its wait returned), if it did."""
        return None if self.recv is None else self.recv.end
