"""The courier: the one process that moves bytes between ranks, and so the one that knows.

It runs in the grader (trusted, no student code). Each rank of a launch holds one end of a
socketpair and nothing else; every ``torch.distributed`` call arrives here as an ``op`` frame
(`autograder.sandbox.backend`). The courier

* pairs each send with the receive that takes it (per pair and tag, first posted first served;
  a blocking send completes only when its receive is posted, as on gloo), checks that sizes and
  dtypes agree, delivers the bytes and keeps them (`Op.data`) for the judges;
* joins each collective with its peers' (the k-th call of every member of a group), computes it
  (`reduce`) when the lab allows it, and refuses it otherwise; keeps its inputs (`Op.data`);
* sends each rank its cases one at a time, with that rank's inputs only, and takes its output;
* sees a deadlock as it forms: every rank still in the launch waits on a call nobody can
  match, or has already returned (`stuck`);
* ends the launch with a `Failure` on anything else: a size mismatch, a frame it does not
  accept (forged or corrupted), an exception a rank reports, a rank that vanished.

What it records (`Op`, `RankTraffic` per case and rank) is what the checks judge. Frame
handling is in `courier_frames`; this module holds the state and the matching.

Memory. All it holds belongs to one launch (the grader judges a launch as soon as it ends and
drops its record: `autograder.judging.judge_launch`), and every part is capped per launch, far
above what the busiest launch of a reference solution of labs 01-07 needs (in parentheses;
`benchmarks/grader_footprint.py`, hidden checks included): calls, marks and gates
MAX_CALLS × CALL_RECORD_BYTES = 50,000 × 1,100 B ≈ 52 MiB (260), then call_limit; stacks of
waits p × MAX_STACKS × STACK_BYTES = p × 16 × 32 KiB, 2 MiB at 4 ranks (1 per rank), later
ones not kept;
results RESULT_BYTES = 64 MiB (1.0 MiB) and RESULT_NODES = 20,000 values (1,640: a tree of
empty lists costs no bytes but ~70 B of grader memory per node), then result_limit; message
contents, sends' and collectives' inputs, KEEP_BYTES = 64 MiB (1.5 MiB; collectives: 0.06),
later ones not kept; sends and collective inputs awaiting their peers HELD_BYTES =
64 MiB (0.13 MiB) and replies not yet read, all ranks together, OUTBOX_BYTES = 64 MiB
(0.75 MiB), then memory_limit. A record is an `Op` with its id and, while it waits, its
`Pending`: a pending receive is the largest (1,004 B, tracemalloc,
`tests/test_courier_limits`), a mark of 200 characters about 350 B, a gate less. With the
frames being read (one per rank at most, `channel.MAX_META` + `MAX_PAYLOAD`), one launch is
bounded by about 0.6 GiB at 4 ranks over the grader's own 250-310 MiB.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

import torch

from ..protocol import Failure, Op, RankEnd, RankTraffic
from .channel import encode_frame, pack, tensor_bytes
from .plan import CasePlan
from .reduce import COLLECTIVES, ROOTED, CollectiveError

# Caps per launch (see the table above; the figures in parentheses are the most a reference
# solution of labs 01-07 needs in one launch).
KEEP_BYTES = 64 << 20     # contents of sends and collective inputs kept for the judges
HELD_BYTES = 64 << 20     # sends and collective inputs waiting for their peers (0.13 MiB)
RESULT_BYTES = 64 << 20   # results the ranks return (1.0 MiB)
RESULT_NODES = 20_000     # values in results: tensors, lists, numbers (RESULT_NODES_USED)
RESULT_NODES_USED = 1_640  # the most a reference's launch returns (labs 01-07, hidden included)
OUTBOX_BYTES = 64 << 20   # replies not yet read, all ranks together (0.75 MiB)
MAX_CALLS = 50_000        # calls, marks and gates recorded, each one kept (240 + 120)
MAX_STACKS = 16           # stacks kept per rank of the calls it waits on at once (1)
CALL_RECORD_BYTES = 1100  # the most one recorded call holds (a pending receive: 1,004 B)
STACK_BYTES = 32 << 10    # the most one kept stack holds (40 frames of capped text: 31.6 KB)


@dataclass
class Pending:
    """An op the courier has not completed yet."""

    op: Op
    op_id: int
    inputs: list[torch.Tensor] = field(default_factory=list)
    specs: list[tuple[str, list[int]]] = field(default_factory=list)
    reduce: str = "sum"
    root: int | None = None
    tag: int = 0


@dataclass
class RankState:
    rank: int
    outbox: bytearray = field(default_factory=bytearray)
    confined: dict | None = None
    ready: bool = False
    case: int | None = None
    """Index into the plan of the case this rank is running (None before and after)."""
    next_case: int = 0
    finished: bool = False
    gone: bool = False
    seq: int = 0
    ids: set[int] = field(default_factory=set)
    ops: dict[int, Op] = field(default_factory=dict)
    pending: dict[int, Pending] = field(default_factory=dict)
    blocked: dict[int, list] = field(default_factory=dict)
    """Op id → the stack the rank sent when it started waiting on it (empty past MAX_STACKS)."""
    stacks: int = 0
    """How many of `blocked`'s stacks are not empty."""
    traffic: dict[int, RankTraffic] = field(default_factory=dict)
    outputs: dict[int, Any] = field(default_factory=dict)

    def block(self, op_id: int, stack: list) -> None:
        """The rank waits on `op_id` at `stack`: kept while it waits on fewer than MAX_STACKS
        calls with a stack (a rank waits on one at a time, or one per thread)."""
        old = self.blocked.get(op_id)
        if old:
            self.stacks -= 1
        keep = bool(stack) and self.stacks < MAX_STACKS
        self.blocked[op_id] = stack if keep else []
        self.stacks += keep

    def unblock(self, op_id: int) -> None:
        if self.blocked.pop(op_id, None):
            self.stacks -= 1


class Courier:
    """The broker of one launch of `world_size` ranks over `plan`'s cases."""

    def __init__(self, world_size: int, plan: list[CasePlan], allowed: frozenset[str],
                 refusal: str) -> None:
        self.world_size, self.plan, self.allowed, self.refusal = world_size, plan, allowed, refusal
        self.ranks = [RankState(r) for r in range(world_size)]
        self.sends: dict[tuple[int, int, int], collections.deque] = collections.defaultdict(
            collections.deque)
        self.recvs: dict[tuple[int, int, int], collections.deque] = collections.defaultdict(
            collections.deque)
        self.any_recvs: dict[tuple[int, int], collections.deque] = collections.defaultdict(
            collections.deque)
        self.colls: dict[tuple[int, ...], list[collections.deque]] = {}
        self.arrival = 0
        self.kept = self.held = self.returned = self.calls = self.result_nodes = 0
        self.failure: Failure | None = None
        self.ended: RankEnd | None = None
        """The first rank that reported an error or vanished (classified by the session)."""

    # -- out --------------------------------------------------------------------------------
    def reply(self, rank: int, meta: dict, payload: bytes = b"") -> None:
        outbox = self.ranks[rank].outbox
        outbox += encode_frame(meta, payload)
        unread = sum(len(s.outbox) for s in self.ranks)
        if unread > OUTBOX_BYTES:
            self.fail("memory_limit", f"The ranks left {unread / 2**20:,.0f} MiB of replies "
                      f"unread (the grader holds at most {OUTBOX_BYTES / 2**20:,.0f} MiB; a "
                      "rank must wait for what it asked for).", rank)

    def count_call(self, rank: int) -> bool:
        """Count one call, mark or gate of `rank` against MAX_CALLS; False (and the launch fails,
        call_limit) once there are more: the grader records no more."""
        self.calls += 1
        if self.calls > MAX_CALLS:
            self.fail("call_limit", f"The ranks made over {MAX_CALLS:,} communication calls "
                      "and marks in one launch (a correct solution makes a few hundred); the "
                      "grader keeps a record of each and records no more.", rank)
            return False
        return True

    def hold(self, rank: int, nbytes: int) -> None:
        """`nbytes` more (or fewer, when negative) wait for a peer: sends for their receive,
        collective inputs for the other members' calls."""
        self.held += nbytes
        if nbytes > 0 and self.held > HELD_BYTES:
            self.fail("memory_limit", f"Rank {rank} sent {self.held / 2**20:,.0f} MiB that no "
                      f"peer had taken yet; the grader holds at most "
                      f"{HELD_BYTES / 2**20:,.0f} MiB in flight.", rank)

    def done(self, p: Pending, outputs: list[torch.Tensor] = (), **extra: Any) -> None:
        specs, parts, offset = [], [], 0
        for t in outputs:
            raw = tensor_bytes(t)
            specs.append([str(t.dtype).removeprefix("torch."), list(t.shape), offset, len(raw)])
            parts.append(raw)
            offset += len(raw)
        state = self.ranks[p.op.rank]
        state.pending.pop(p.op_id, None)
        state.unblock(p.op_id)
        self.reply(p.op.rank, {"k": "done", "id": p.op_id, "outputs": specs, **extra},
                   b"".join(parts))

    def fail_op(self, p: Pending, message: str) -> None:
        state = self.ranks[p.op.rank]
        state.pending.pop(p.op_id, None)
        state.unblock(p.op_id)
        self.reply(p.op.rank, {"k": "fail", "id": p.op_id, "message": message})

    def fail(self, kind: str, message: str, rank: int | None = None) -> None:
        if self.failure is None:
            self.failure = Failure(kind, message, rank)

    # -- cases ------------------------------------------------------------------------------
    def next_case(self, rank: int) -> None:
        state = self.ranks[rank]
        if state.next_case >= len(self.plan):
            state.case, state.finished = None, True
            return
        case = self.plan[state.next_case]
        state.case = state.next_case
        state.next_case += 1
        state.traffic[case.index] = RankTraffic(rank)
        tree, payload = pack(case.inputs[rank])
        self.reply(rank, {"k": "case", "case": case.index, "call": case.call,
                          "params": case.params, "inputs": tree}, payload)

    def traffic_of(self, rank: int) -> RankTraffic | None:
        state = self.ranks[rank]
        return state.traffic.get(self.plan[state.case].index) if state.case is not None else None

    @property
    def complete(self) -> bool:
        return all(s.finished for s in self.ranks)

    # -- point-to-point ---------------------------------------------------------------------
    def post_send(self, p: Pending, payload: bytes) -> None:
        src, dst = p.op.rank, p.op.peer
        recv = self._take_recv(src, dst, p.tag)
        if recv is None:
            self.hold(src, len(payload))
            self.sends[(src, dst, p.tag)].append((p, payload, self._next_arrival()))
        else:
            self.match(p, payload, recv)

    def post_recv(self, p: Pending) -> None:
        dst, src = p.op.rank, p.op.peer
        if src == -1:
            found = [(q[0][2], key) for key, q in self.sends.items()
                     if q and key[1] == dst and key[2] == p.tag]
            if not found:
                self.any_recvs[(dst, p.tag)].append(p)
                return
            key = min(found)[1]
        else:
            key = (src, dst, p.tag)
            if not self.sends[key]:
                self.recvs[key].append(p)
                return
        send, payload, _ = self.sends[key].popleft()
        self.hold(dst, -len(payload))
        self.match(send, payload, p)

    def _take_recv(self, src: int, dst: int, tag: int) -> Pending | None:
        """The earliest receive posted on `dst` that takes a message from `src` with `tag`."""
        specific, anyone = self.recvs[(src, dst, tag)], self.any_recvs[(dst, tag)]
        if specific and anyone:
            return (specific if specific[0].op.seq < anyone[0].op.seq else anyone).popleft()
        if specific or anyone:
            return (specific or anyone).popleft()
        return None

    def _next_arrival(self) -> int:
        self.arrival += 1
        return self.arrival

    def match(self, send: Pending, payload: bytes, recv: Pending) -> None:
        s, r = send.op, recv.op
        r.peer = s.rank
        if s.nbytes != r.nbytes or s.dtype != r.dtype:
            self.fail("mismatch", (
                f"Mismatched sizes: rank {s.rank} sent {s.nbytes:,} bytes ({_elements(s)}) to "
                f"rank {r.rank}, whose receive holds {r.nbytes:,} bytes ({_elements(r)}). Every "
                "send must match its receive in size and dtype (on gloo a longer message aborts "
                "the receiver and a shorter one leaves the rest of its buffer as it was)."), r.rank)
            return
        if self.kept + len(payload) <= KEEP_BYTES:
            s.data = payload
            self.kept += len(payload)
        self.done(send)
        dtype, shape = recv.specs[0]
        self.reply(r.rank, {"k": "done", "id": recv.op_id, "source": s.rank,
                            "outputs": [[dtype, shape, 0, len(payload)]]}, payload)
        self.ranks[r.rank].pending.pop(recv.op_id, None)
        self.ranks[r.rank].unblock(recv.op_id)

    # -- collectives ------------------------------------------------------------------------
    def post_collective(self, p: Pending) -> None:
        group = p.op.group
        queues = self.colls.setdefault(group, [collections.deque() for _ in group])
        queues[group.index(p.op.rank)].append(p)
        self.hold(p.op.rank, _nbytes(p))
        while all(queues):
            calls = [q.popleft() for q in queues]
            self.hold(p.op.rank, -sum(_nbytes(c) for c in calls))
            self._run(group, calls)

    def _run(self, group: tuple[int, ...], calls: list[Pending]) -> None:
        first = calls[0]
        for c in calls[1:]:
            if (c.op.op, c.reduce, c.root) != (first.op.op, first.reduce, first.root):
                self.fail("mismatch", (
                    f"Mismatched collectives: rank {first.op.rank} called {_coll(first)} while "
                    f"rank {c.op.rank} called {_coll(c)} as its next collective on the same "
                    "group. Every rank must make the same collectives in the same order."),
                    c.op.rank)
                return
        fn = COLLECTIVES[first.op.op]
        root = group.index(first.root) if first.op.op in ROOTED else 0
        try:
            outs = fn([c.inputs for c in calls], [c.specs for c in calls], how=first.reduce,
                      root=root)
        except CollectiveError as err:
            self.fail("mismatch", f"Mismatched {first.op.op} on ranks {list(group)}: {err}.")
            return
        for c, out in zip(calls, outs):
            self.keep(c)
            self.done(c, out)

    def keep(self, p: Pending) -> None:
        """Keep a collective's inputs (`Op.data`, all of them end to end) for the judges that
        compare what each rank contributed, within the launch's KEEP_BYTES."""
        raw = b"".join(tensor_bytes(t) for t in p.inputs)
        if raw and self.kept + len(raw) <= KEEP_BYTES:
            p.op.data = raw
            self.kept += len(raw)

    # -- deadlocks --------------------------------------------------------------------------
    def stuck(self) -> bool:
        """Every rank still here waits on a call nobody can complete, or has returned, and at
        least one waits: nothing can change any more."""
        waiting = False
        for s in self.ranks:
            if s.gone or s.finished:
                continue
            if not s.blocked:
                return False
            waiting = True
        return waiting


def _nbytes(p: Pending) -> int:
    return sum(t.numel() * t.element_size() for t in p.inputs)


def _elements(op: Op) -> str:
    item = torch.empty(0, dtype=getattr(torch, op.dtype, torch.uint8)).element_size()
    return f"{op.nbytes // max(item, 1):,} {op.dtype}"


def _coll(p: Pending) -> str:
    extra = f", root {p.root}" if p.root is not None else ""
    extra += f", {p.reduce}" if p.op.op in ("all_reduce", "reduce", "reduce_scatter",
                                            "reduce_scatter_single") else ""
    return f"{p.op.op} ({p.op.nbytes:,} bytes{extra})"


__all__ = ["CALL_RECORD_BYTES", "Courier", "HELD_BYTES", "KEEP_BYTES", "MAX_CALLS", "MAX_STACKS",
           "OUTBOX_BYTES", "Pending", "RESULT_BYTES", "RankState", "STACK_BYTES"]
