"""How a rank ended, as the parent learns it: one `RankOutcome`, sent over the pipe as plain data.

A rank either returned (``"ok"``: its value, the events it recorded, how many it dropped),
raised (``"error"``: a `RankFailure` with the traceback as text, and its events), or ended
without a word (``"died"``: the exit code, negative for a signal, which only the parent sees).

The rank writes `RankOutcome.to_plain()`: a dict of builtins (events as tuples, the exception
pickled into bytes). So the parent of untrusted ranks decodes a frame with
`toolkit.launch.safe_pickle.loads`, which refuses every class, and rebuilds the dataclass
with `RankOutcome.from_plain`, which checks the shape of what arrived.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Any

from ..comm.events import Event

KINDS = ("ok", "error", "died")
FAILURE_KINDS = ("init", "exception", "result")
"""Where a rank failed: joining the process group, inside fn, or sending fn's value back."""


@dataclass(frozen=True)
class RankFailure:
    """What a rank that raised reports about it."""

    kind: str
    """One of `FAILURE_KINDS`."""
    exc_type: str
    """Name of the exception's class, e.g. ``"ValueError"``."""
    message: str
    traceback: str = ""
    """The rank's traceback as text (from fn's frame down)."""
    exception: bytes | None = None
    """The exception pickled with cloudpickle (rebuilt only for trusted ranks), or None."""
    time: float = field(default_factory=time.time)
    """When it failed (seconds since the epoch): the first failure in time is the cause."""


@dataclass(frozen=True)
class RankOutcome:
    """How one rank ended (module docstring). Build one with `ok`, `error` or `died`."""

    kind: str
    """One of `KINDS`."""
    value: Any = None
    """``"ok"``: what fn returned."""
    failure: RankFailure | None = None
    """``"error"``: what went wrong."""
    events: list[tuple] = field(default_factory=list)
    """``"ok"`` and ``"error"``: the recorded events, as `Event.as_tuple()` tuples."""
    dropped: int = 0
    """Events the rank could not keep (over the recording's cap)."""
    exit_code: int | None = None
    """``"died"``: the exit code; negative: killed by that signal."""

    @classmethod
    def ok(cls, value: Any, events: list[tuple], dropped: int) -> "RankOutcome":
        return cls("ok", value=value, events=events, dropped=dropped)

    @classmethod
    def error(cls, failure: RankFailure, events: list[tuple] = (), dropped: int = 0
              ) -> "RankOutcome":
        return cls("error", failure=failure, events=list(events), dropped=dropped)

    @classmethod
    def died(cls, exit_code: int | None) -> "RankOutcome":
        return cls("died", exit_code=exit_code)

    def to_plain(self) -> dict[str, Any]:
        """Builtins only (the value itself is left as fn returned it)."""
        failure = None
        if self.failure is not None:
            f = self.failure
            failure = {"kind": f.kind, "exc_type": f.exc_type, "message": f.message,
                       "traceback": f.traceback, "exception": f.exception, "time": f.time}
        return {"kind": self.kind, "value": self.value, "failure": failure,
                "events": self.events, "dropped": self.dropped, "exit_code": self.exit_code}

    @classmethod
    def from_plain(cls, data: Any) -> "RankOutcome":
        """The inverse of `to_plain`; a ValueError when `data` does not have its shape."""
        if not isinstance(data, dict) or data.get("kind") not in KINDS:
            raise ValueError(f"not a rank outcome: {str(data)[:80]}")
        failure = data.get("failure")
        if data["kind"] == "error":
            failure = _failure_from_plain(failure)
        events, dropped = data.get("events") or [], data.get("dropped") or 0
        width = len(fields(Event))
        if (not isinstance(events, list) or not isinstance(dropped, int)
                or not all(isinstance(e, (tuple, list)) and len(e) == width for e in events)):
            raise ValueError(f"a rank outcome with malformed events: {str(data)[:80]}")
        return cls(data["kind"], value=data.get("value"), failure=failure, events=events,
                   dropped=dropped, exit_code=data.get("exit_code"))


def _failure_from_plain(failure: Any) -> RankFailure:
    text = ("exc_type", "message", "traceback")
    if (not isinstance(failure, dict) or failure.get("kind") not in FAILURE_KINDS
            or not all(isinstance(failure.get(k), str) for k in text)
            or not isinstance(failure.get("exception"), (bytes, type(None)))
            or not isinstance(failure.get("time"), (int, float))):
        raise ValueError(f"a rank's error outcome without a well-formed failure: "
                         f"{str(failure)[:80]}")
    return RankFailure(failure["kind"], *(failure[k] for k in text), failure["exception"],
                       float(failure["time"]))


__all__ = ["FAILURE_KINDS", "KINDS", "RankFailure", "RankOutcome"]
