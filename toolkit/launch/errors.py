"""What `spawn` raises when a launch does not end with a result from every rank."""

from __future__ import annotations


class SpawnError(RuntimeError):
    """Base class: a launch that did not return every rank's result."""


class RankError(SpawnError):
    """A rank raised an exception, died, or returned something that cannot be sent back.

    The message holds the rank's own traceback. Attributes give the parts:

    - ``rank``, ``world_size``
    - ``kind``: ``"exception"`` (fn raised), ``"init"`` (setting up the process group failed),
      ``"result"`` (the return value could not be pickled), ``"exit"`` (the process ended
      without reporting, e.g. ``os._exit`` or ``sys.exit``), ``"signal"`` (killed by a signal,
      e.g. a segfault or the out-of-memory killer)
    - ``exc_type``: the exception's class name, e.g. ``"ValueError"`` (None for exit/signal)
    - ``exception``: the exception object from the rank, when it could be sent back, else None
    - ``traceback``: the rank's formatted traceback (str; may be empty)
    - ``exit_code``: the process's exit code, negative for a signal (None if unknown)
    - ``output``: the last lines the rank printed (stdout and stderr)
    - ``others``: one line for each other rank that also failed before it was stopped
    """

    def __init__(self, message: str, *, rank: int, world_size: int, kind: str,
                 exc_type: str | None = None, exception: BaseException | None = None,
                 traceback: str = "", exit_code: int | None = None, output: str = "",
                 others: list[str] | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.world_size = world_size
        self.kind = kind
        self.exc_type = exc_type
        self.exception = exception
        self.traceback = traceback
        self.exit_code = exit_code
        self.output = output
        self.others = others or []


class SpawnTimeout(SpawnError, TimeoutError):
    """The launch ran past its timeout; every rank was stopped.

    ``stuck`` maps each rank still running to a description of where it was: the communication
    call it was in (from the in-flight board) and its Python stack at the moment it was stopped.
    ``finished`` lists the ranks that had already returned.
    """

    def __init__(self, message: str, *, timeout: float, stuck: dict[int, str],
                 finished: list[int]) -> None:
        super().__init__(message)
        self.timeout = timeout
        self.stuck = stuck
        self.finished = finished
