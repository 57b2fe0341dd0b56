"""The grader's typed seam: what a run establishes, and what a judge receives and returns.

Every fact a check relies on is built in the grader's own process by the courier
(`autograder.sandbox.courier`), from the bytes it moved between ranks, never from what a rank
says about itself:

* `Op`: one call one rank made through its process group (send, recv, a collective), in the
  order the courier received it, with its sizes and, for sends, its bytes;
* `RankTraffic`: one rank's ops, the harness's marks and the gates the courier answered
  (`Gate`) during one case (or one section of a case), with the totals judges use (bytes and
  messages sent and received, calls per op);
* `GroupRecord`: how one launch of a check at one world size ended: the ranks' outputs per case
  and their traffic (until judged: then its verdicts), or the `Failure` that ended it;
* `Verdict`: a judge's answer for one case (passed, message, and a failure kind when the case
  failed for a named reason, `autograder.failures.KINDS`).

`GroupKey` and `CaseKey` are the only ids: objects, never strings parsed back.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

P2P = frozenset({"send", "recv"})
_INDEXED = ("indexed",)  # RankTraffic._where's count of entries indexed (no label is a tuple)

# torch.distributed's function names → the process-group operation the courier sees (torch
# 2.13 routes reduce_scatter_tensor to reduce_scatter_single and all_gather_into_tensor to
# all_gather_single; the old names are deprecated aliases).
ALIASES = {"reduce_scatter_tensor": "reduce_scatter_single",
           "all_gather_into_tensor": "all_gather_single",
           "_reduce_scatter_base": "reduce_scatter_single", "_all_gather_base": "all_gather_single",
           "isend": "send", "irecv": "recv", "all_to_all_single": "alltoall_base"}


def canonical_op(name: str) -> str:
    """The operation a torch.distributed function name stands for (e.g. all_gather_into_tensor
    → all_gather_single), so a lab allowing one name allows its alias too."""
    return ALIASES.get(name, name)


@dataclass(frozen=True, order=True)
class GroupKey:
    """One launch: check number `check` (its index in the lab) at `world_size` ranks."""

    check: int
    world_size: int

    def __str__(self) -> str:
        return f"check {self.check + 1} at {self.world_size} ranks"


@dataclass(frozen=True, order=True)
class CaseKey:
    """Case number `index` of check number `check`."""

    check: int
    index: int


@dataclass(frozen=True)
class Verdict:
    """A judge's answer for one case. `kind` names why a failed case failed (a key of
    `autograder.failures.KINDS`); None means wrong_result."""

    passed: bool
    message: str = ""
    kind: str | None = None


@dataclass
class Op:
    """One call of one rank, as the courier received it."""

    rank: int
    seq: int
    """Position among this rank's calls in the launch (0, 1, ...)."""
    op: str
    """Process-group operation: send, recv, all_reduce, broadcast, barrier, reduce,
    all_gather, all_gather_single, reduce_scatter, reduce_scatter_single, gather, scatter."""
    peer: int | None
    """Point-to-point: the other rank (global; for a receive from any source, who sent).
    Rooted collectives: the root. Otherwise None."""
    nbytes: int
    """Bytes this rank passed in (send: the message; recv: its buffer; collectives: inputs)."""
    dtype: str
    shape: tuple[int, ...]
    async_op: bool = False
    group: tuple[int, ...] = ()
    """Global ranks of the process group it was called on."""
    refused: str = ""
    """Why the courier refused it (a collective the lab does not allow); empty otherwise."""
    observed: bool = False
    """The rank waited on it, saw is_completed() return True or asked for its future."""
    observed_at: int | None = None
    """How many entries of the rank's log (ops and marks) preceded that observation."""
    data: bytes | None = None
    """Sends: the bytes sent; collectives: the inputs, end to end; when the courier kept them
    (see Courier.KEEP_BYTES)."""


@dataclass(eq=False)
class Gate:
    """A gate the courier answered (`autograder.sandbox.gate`): the rank's n-th in the case and
    the scale it was told. Unlike a mark, no frame of a rank can make one say something else."""

    n: int
    scale: float


@dataclass
class RankTraffic:
    """One rank's calls during one case (or one section of it), in the order received."""

    rank: int
    ops: list[Op] = field(default_factory=list)
    marks: list[tuple[str, int]] = field(default_factory=list)
    """(label, number of entries before it): where the harness's marks fell among the ops."""
    gates: list[Gate] = field(default_factory=list)
    """The gates the courier answered, in order."""
    entries: list[Op | str | Gate] = field(default_factory=list)
    """Ops, mark labels and gates interleaved, as they arrived."""
    _where: dict = field(default_factory=dict, repr=False, compare=False)
    """`position`'s index: id of an op or gate, or a mark's label → its first position, built
    once over `entries` (a judge asks for many positions: a scan each was quadratic in what a
    rank sent, 9.9 s a call at 20,000 entries)."""

    @property
    def sends(self) -> list[Op]:
        return [o for o in self.ops if o.op == "send"]

    @property
    def receives(self) -> list[Op]:
        return [o for o in self.ops if o.op == "recv"]

    @property
    def bytes_sent(self) -> int:
        return sum(o.nbytes for o in self.sends)

    @property
    def bytes_received(self) -> int:
        return sum(o.nbytes for o in self.receives)

    @property
    def messages_sent(self) -> int:
        return len(self.sends)

    @property
    def messages_received(self) -> int:
        return len(self.receives)

    @property
    def collective_bytes(self) -> int:
        return sum(o.nbytes for o in self.ops if o.op not in P2P and not o.refused)

    @property
    def calls(self) -> dict[str, int]:
        """Calls per operation (refused ones included)."""
        return dict(Counter(o.op for o in self.ops))

    @property
    def refused(self) -> list[Op]:
        return [o for o in self.ops if o.refused]

    def section(self, label: str) -> "RankTraffic":
        """The entries between the marks ``label + ":begin"`` and ``label + ":end"`` (to the
        end when it never ended; empty when it never began)."""
        begin, end = f"{label}:begin", f"{label}:end"
        out, inside = RankTraffic(self.rank), False
        for entry in self.entries:
            if entry == begin:
                inside = True
            elif entry == end:
                inside = False
            elif inside:
                out.add(entry)
        return out

    def before(self, label: str) -> list[Op] | None:
        """Ops that arrived before the first mark `label` (None when it never came)."""
        ops = []
        for entry in self.entries:
            if entry == label:
                return ops
            if isinstance(entry, Op):
                ops.append(entry)
        return None

    def position(self, entry: Op | str | Gate) -> int | None:
        """Where `entry` (an op or a gate, by identity, or a mark's label) first is among the
        entries: O(1) after one pass over entries not indexed yet."""
        where, done = self._where, self._where.get(_INDEXED, 0)
        for i in range(done, len(self.entries)):
            e = self.entries[i]
            where.setdefault(e if isinstance(e, str) else id(e), i)
        where[_INDEXED] = len(self.entries)
        at = where.get(entry if isinstance(entry, str) else id(entry))
        return at if at is not None and (isinstance(entry, str)
                                         or self.entries[at] is entry) else None

    def add(self, entry: Op | str | Gate) -> None:
        if isinstance(entry, Op):
            self.ops.append(entry)
        elif isinstance(entry, Gate):
            self.gates.append(entry)
        else:
            self.marks.append((entry, len(self.entries)))
        self.entries.append(entry)


@dataclass
class Failure:
    """Why a launch (or one case of it) failed: a kind of `autograder.failures.KINDS`, words
    for the student, and the rank it happened on when one is to blame."""

    kind: str
    message: str
    rank: int | None = None


@dataclass
class RankEnd:
    """How one rank stopped early: an error it reported (type, message, traceback, all
    untrusted text) or a process exit the fork server saw (`exit_code`, negative: signal)."""

    rank: int
    how: str
    """"error" (reported an exception), "exit" (the process ended on its own) or "killed"."""
    phase: str = "case"
    """"setup" (before the student's module was imported), "import" or "case"."""
    exc_type: str = ""
    message: str = ""
    traceback: str = ""
    exit_code: int | None = None


@dataclass
class GroupRecord:
    """One launch: the outputs and traffic of every case that finished, or its failure."""

    key: GroupKey
    outputs: dict[int, list[Any]] = field(default_factory=dict)
    """Case index → each rank's decoded output."""
    traffic: dict[int, list[RankTraffic]] = field(default_factory=dict)
    """Case index → each rank's traffic in that case."""
    failure: Failure | None = None
    printed: int = 0
    """Bytes the ranks wrote to stdout and stderr."""
    log_tail: str = ""
    """The last few kB the ranks printed (sanitised), for messages."""
    forged: list[str] = field(default_factory=list)
    """Entries named results.json that the ranks left in their folders."""
    verdicts: list[Verdict] | None = None
    """Its cases judged as soon as the launch ended (`judging.judge_launch`), which then drops
    `outputs` and `traffic`: the grader keeps no launch's results while the next one runs."""

    @property
    def ok(self) -> bool:
        return self.failure is None


__all__ = ["ALIASES", "CaseKey", "Failure", "Gate", "GroupKey", "GroupRecord", "Op", "P2P",
           "RankEnd", "RankTraffic", "Verdict", "canonical_op"]
