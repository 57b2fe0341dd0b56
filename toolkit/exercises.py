"""Checks for the lessons' exercises: none of them prints the answer.

A lesson's exercises are written once, in the instructor's notebook, with the answer inside a
solution region; the student edition (`autograder release --course`) replaces the region by its
``### STUB:`` lines, so the suite runs every check against the real answer and a student sees
only the stub and the hints (a cell's lines, shown after a bar so that this docstring holds
no marker line of its own: the student edition is checked for none)::

    | ### BEGIN SOLUTION
    | answer_lr = 0.8
    | ### END SOLUTION
    | ### STUB: answer_lr = None   # a float
    | ### HINT: the batch grew by a factor of 8; what does the linear rule do with the rate?

Two kinds of check:

* **A value** (a number, a tuple of numbers, a word) against a sealed key: `seal(value)` (run
  once by the author, its output pasted into the check cell) is a SHA-256 digest of the value
  rounded to `sig` significant digits, so the check cell holds no answer to read.
  `check_value(n, answer, key, hint=...)` says "correct", raises `AssertionError` with the hint,
  or, while the answer is still ``None``, says what to fill in.
* **Code that runs on ranks**: `attempt(n, fn, world_size, ...)` spawns the student's rank
  function with the recorder on and returns ``(results, trace)``, or ``None`` while ``fn`` is
  still the stub (it raises `NotImplementedError`); the check cell then judges values and
  traffic against plain math (a sum, a slice), never against a reference implementation, and
  reports with `require` (a failed requirement raises with its hint) and `correct`.

A digest of a small number can be found by trying candidates: the seal keeps the answer out
of sight, as a sealed envelope does, not out of reach of someone who wants to cheat themselves.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, Callable

from . import comm
from .launch import RankError, spawn

DEFAULT_SIG = 4
"""Significant digits a float answer is compared to (and sealed with)."""


def pending(*answers: Any) -> bool:
    """True while any answer is still the stub's ``None`` (or ``...``)."""
    return any(a is None or a is Ellipsis for a in answers)


def _canon(value: Any, sig: int) -> str:
    """One text per value: ints exact, floats to `sig` significant digits, words lower-case."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return repr(value)
        if value == 0.0:
            return "0"
        text = f"{value:.{sig}g}"
        # 3.0 and 3 are one answer; so are 1e+03 and 1000.
        as_float = float(text)
        return str(int(as_float)) if as_float.is_integer() and abs(as_float) < 1e15 else text
    if isinstance(value, str):
        return " ".join(value.strip().lower().split())
    if isinstance(value, (tuple, list)):
        return "(" + ",".join(_canon(v, sig) for v in value) + ")"
    if hasattr(value, "item") and callable(value.item):  # a 0-d tensor or numpy scalar
        return _canon(value.item(), sig)
    raise TypeError(f"an exercise answer must be a number, a word or a tuple of those, "
                    f"got {type(value).__name__}")


def seal(value: Any, *, sig: int = DEFAULT_SIG) -> str:
    """The key of `value`: paste it into the check cell (`check_value(..., key=...)`)."""
    return hashlib.sha256(_canon(value, sig).encode()).hexdigest()[:24]


def _nudged(value: Any, rel: float) -> list[Any]:
    """`value` and its neighbours at ±rel: an answer a rounding boundary away still matches."""
    if isinstance(value, float):
        return [value, value * (1 + rel), value * (1 - rel)]
    if isinstance(value, (tuple, list)):
        options = [_nudged(v, rel) for v in value]
        return [tuple(o[k] if len(o) > k else o[0] for o in options) for k in range(3)]
    return [value]


def matches(answer: Any, key: str, *, sig: int = DEFAULT_SIG) -> bool:
    """Whether `answer` seals to `key`; a float a hair's breadth (10^-(sig+1) relative) from a
    rounding boundary counts, so 0.12345 and 0.1234500001 are one answer at 4 digits."""
    rel = 10.0 ** (-sig - 1)
    try:
        return any(seal(a, sig=sig) == key for a in _nudged(answer, rel))
    except TypeError:
        return False


def check_value(number: int, answer: Any, key: str, *, hint: str, what: str = "the answer",
                sig: int = DEFAULT_SIG) -> bool:
    """Say whether `answer` is right without saying what is: True if right, False while it is
    the stub's None; raises AssertionError with `hint` if wrong."""
    if pending(*(answer if isinstance(answer, (tuple, list)) else (answer,))):
        print(f"Exercise {number}: fill in {what}, then run this cell again.")
        return False
    if not matches(answer, key, sig=sig):
        raise AssertionError(f"Exercise {number}: not quite ({answer!r}). Hint: {hint}")
    print(f"Exercise {number}: correct.")
    return True


def _is_stub(error: BaseException) -> bool:
    if isinstance(error, NotImplementedError):
        return True
    return isinstance(error, RankError) and error.exc_type == "NotImplementedError"


def attempt(number: int, fn: Callable[..., Any], world_size: int, *args: Any,
            timeout: float = 60.0, **spawn_kwargs: Any):
    """Run the student's rank function on `world_size` real ranks, recorded.

    Returns ``(results, trace)``: each rank's return value and the recorded messages; or None
    (after saying what to fill in) while `fn` still raises NotImplementedError. Any other
    failure (an exception in a rank, a hang) is raised as `spawn` raises it, naming the rank."""
    try:
        with comm.recording() as trace:
            results = spawn(fn, world_size, *args, timeout=timeout, echo=False,
                            **spawn_kwargs)
    except (NotImplementedError, RankError) as error:
        if _is_stub(error):
            print(f"Exercise {number}: fill in `{getattr(fn, '__name__', 'the function')}`, "
                  "then run this cell again.")
            return None
        raise
    return results, trace


def attempt_local(number: int, fn: Callable[..., Any], *args: Any, **kwargs: Any):
    """`fn(*args, **kwargs)` in this process; None (after saying so) while it is the stub."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedError:
        print(f"Exercise {number}: fill in `{getattr(fn, '__name__', 'the function')}`, "
              "then run this cell again.")
        return None


def require(number: int, ok: bool, problem: str, *, hint: str) -> None:
    """Raise AssertionError naming `problem` and the hint unless `ok`; the problem says what
    was observed (a rank, a count, an index), never what the right code is."""
    if not ok:
        raise AssertionError(f"Exercise {number}: {problem}. Hint: {hint}")


def correct(number: int, message: str = "") -> None:
    """Say the exercise passed (`message`: what was checked, not how to do it)."""
    print(f"Exercise {number}: correct" + (f", {message}" if message else "."))


__all__ = ["DEFAULT_SIG", "attempt", "attempt_local", "check_value", "correct", "matches",
           "pending", "require", "seal"]
