"""What a lab's harness receives for one case in one rank: `Call`.

A lab's ``harness.py`` defines ``CALLS[name](student, call) -> output``. `call` carries this
rank's number, the world size, the case's public parameters (sizes, dtypes, roots: never the
grade's secret), this rank's inputs (made by the grader from a per-grade secret and delivered
to this rank alone), the device its tensors go on, two ways to tell the courier where a
case is, and a gate:

    with call.section("fwd"):        # every call made inside lands in the section "fwd"
        y = layer(x)
    call.mark("here")                 # a point between two calls
    s = call.gate()                   # a round trip: the courier's next scale for this case

Marks travel on the same channel as the calls, so the courier knows exactly which calls came
before a mark and which after. They are the harness's word, as is everything a rank sends: a
submission could forge a mark, and the docs say which checks rest on them (docs/grading.md).
A gate is not a claim but a question: the courier records where it read it among the rank's
calls and answers `autograder.sandbox.gate.scale(key, n)` for the rank's n-th gate of the case,
from a key the rank never holds. A harness that makes a result need the answer (lab 02 scales
the first layer's gradient by it) knows that the result was computed after the courier saw the
gate, and so after every call the courier saw before it. With no channel (a `Call` made outside
the grader) the answer is the public schedule `scale(LOCAL_KEY, n)`.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

from .backend import Link
from .gate import LOCAL_KEY, scale


@dataclass
class Call:
    rank: int
    world_size: int
    case: dict
    """The case's public parameters (the grader keeps its seed)."""
    inputs: Any
    """This rank's inputs for the case, as the lab's ``make_inputs(case, world_size)[rank]``
    (drawn on the CPU, as the grader's expected values are)."""
    device: str = "cpu"
    """Where this rank's tensors go: a harness moves its inputs and models here
    (``call.inputs.to(call.device)``). The grade's device, "cpu" while grading runs on CPU."""
    _link: Link | None = None
    _asked: int = 0
    """Gates asked without a channel (the index of the next local answer)."""

    def gate(self) -> float:
        """Ask the courier for this case's next scale (> 1, exact in float32) and wait for it.
        One gate at a time: the answers come back in the order the gates were asked."""
        if self._link is None:
            self._asked += 1
            return scale(LOCAL_KEY, self._asked - 1)
        self._link.send({"k": "gate"})
        return float(self._link.gates.get()["scale"])

    def mark(self, label: str) -> None:
        """Note `label` between this rank's calls (in the courier's record of the case)."""
        if self._link is not None:
            self._link.send({"k": "mark", "label": str(label)[:200]})

    @contextmanager
    def section(self, label: str) -> Iterator[None]:
        """Calls made inside the block form the section `label` (``RankTraffic.section``)."""
        self.mark(f"{label}:begin")
        try:
            yield
        finally:
            self.mark(f"{label}:end")


__all__ = ["Call"]
