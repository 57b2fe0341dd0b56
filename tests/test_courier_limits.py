"""The courier's caps per launch, without processes (frames fed by hand): every record a frame
leaves in the grader is counted or capped, and the bytes per record that the bound in
`autograder.sandbox.courier`'s docstring rests on are measured here (tracemalloc).

* calls and marks together stop at MAX_CALLS (call_limit), nothing recorded past it;
* results stop at RESULT_BYTES (result_limit), the last output not decoded;
* stacks of waits: at most MAX_STACKS kept per rank, every wait still known (deadlocks), and a
  deadlock's message names a few calls, not every one;
* collective inputs waiting for their peers count against HELD_BYTES, replies not yet read
  against OUTBOX_BYTES, all ranks together.
"""

from __future__ import annotations

import json
import tracemalloc

import torch
from test_courier import courier, op, replies

from autograder import hangs
from autograder.sandbox import courier as cm
from autograder.sandbox.channel import pack
from autograder.sandbox.courier_frames import handle

# The most of a stack the courier keeps (40 frames, 500 + 100 characters), as JSON: decoded
# for every frame, as the grader does, so that no two frames share a string.
STACK = json.dumps([["/" + "s" * 499, 1, "f" * 100]] * 40)


def _wait(c, rank: int, op_id: int) -> None:
    handle(c, rank, {"k": "wait", "id": op_id, "stack": json.loads(STACK)}, b"")


def test_marks_and_calls_share_the_call_limit(monkeypatch):
    monkeypatch.setattr(cm, "MAX_CALLS", 1000)
    c = courier(2)
    for i in range(400):
        op(c, 0, i, "recv", outputs=[torch.empty(1)], peer=1, tag=5)
    for i in range(600):
        handle(c, 1, {"k": "mark", "label": f"m{i}"}, b"")
    assert c.failure is None and c.calls == 1000
    handle(c, 1, {"k": "mark", "label": "one too many"}, b"")
    assert c.failure.kind == "call_limit" and "over 1,000 communication calls and marks" in \
        c.failure.message
    op(c, 0, 400, "recv", outputs=[torch.empty(1)], peer=1, tag=5)
    assert len(c.traffic_of(1).marks) == 600 and len(c.traffic_of(0).ops) == 400


def test_results_past_the_cap_are_a_result_limit_and_not_decoded(monkeypatch):
    monkeypatch.setattr(cm, "RESULT_BYTES", 1 << 20)
    monkeypatch.setattr("autograder.sandbox.courier_frames.RESULT_BYTES", 1 << 20)
    c = courier(2)
    for rank in (0, 1):
        tree, payload = pack(torch.ones(160_000))  # 640,000 bytes each: the second passes 1 MiB
        handle(c, rank, {"k": "output", "case": 0, "tree": tree}, payload)
    assert c.failure.kind == "result_limit" and "keeps at most 1 MiB" in c.failure.message
    assert 0 in c.ranks[0].outputs and 0 not in c.ranks[1].outputs


def test_a_rank_keeps_at_most_max_stacks_and_every_wait_is_known():
    c = courier(2)
    n = cm.MAX_STACKS + 20
    for i in range(n):
        op(c, 0, i, "recv", outputs=[torch.empty(1)], peer=1, tag=9)
        _wait(c, 0, i)
    state = c.ranks[0]
    assert len(state.blocked) == n
    assert sum(1 for s in state.blocked.values() if s) == state.stacks == cm.MAX_STACKS
    op(c, 1, 0, "send", [torch.ones(1)], peer=0, tag=9)  # completes op 0, whose stack was kept
    assert 0 not in state.blocked and state.stacks == cm.MAX_STACKS - 1
    _wait(c, 0, n - 1)  # its stack is kept now: there is room again
    assert state.blocked[n - 1] and state.stacks == cm.MAX_STACKS
    op(c, 1, 1, "recv", outputs=[torch.empty(1)], peer=0, tag=3)
    handle(c, 1, {"k": "wait", "id": 1, "stack": []}, b"")
    assert c.stuck()
    text = hangs.deadlock(c, "collectives", {}).message
    assert text.count("rank 0 in recv from rank 1") == hangs.NAMED
    assert f"rank 0 in {n - 1 - hangs.NAMED:,} more calls" in text


def test_collective_inputs_waiting_for_peers_are_held_bytes(monkeypatch):
    monkeypatch.setattr(cm, "HELD_BYTES", 1 << 20)
    c = courier(2, frozenset({"all_reduce"}))
    t = torch.ones(75_000)  # 300,000 bytes

    def all_reduce(rank, op_id, **extra):
        op(c, rank, op_id, "all_reduce", [t], [t], reduce="sum", **extra)

    all_reduce(0, 0, **{"async": True})
    all_reduce(0, 1, **{"async": True})
    assert c.held == 600_000 and c.failure is None
    all_reduce(1, 0)
    assert c.held == 300_000  # the first was joined and computed: its inputs are gone
    all_reduce(0, 2, **{"async": True})
    all_reduce(0, 3, **{"async": True})
    assert c.held == 900_000 and c.failure is None
    all_reduce(0, 4, **{"async": True})  # 1,200,000 bytes wait: past 1 MiB
    assert c.failure.kind == "memory_limit" and "holds at most 1 MiB" in c.failure.message


def test_replies_not_read_are_capped_for_all_ranks_together(monkeypatch):
    monkeypatch.setattr(cm, "OUTBOX_BYTES", 1 << 20)
    c = courier(3)
    for rank in (0, 1, 2):
        c.reply(rank, {"k": "x"}, bytes(300_000))
    assert c.failure is None
    c.reply(0, {"k": "x"}, bytes(300_000))
    assert c.failure.kind == "memory_limit" and "1 MiB" in c.failure.message


def _per_record(make, n: int = 5000) -> float:
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        make(n)
        return (tracemalloc.get_traced_memory()[0] - before) / n
    finally:
        tracemalloc.stop()


def test_the_bytes_per_record_stay_within_the_documented_bound():
    """The docstring's bound is MAX_CALLS × CALL_RECORD_BYTES and MAX_STACKS × STACK_BYTES per
    rank: a pending receive (the largest call record), a mark with a label of the longest
    kind, and a kept stack must each fit."""
    c = courier(2)
    replies(c, 0)

    def receives(n):
        for i in range(n):
            op(c, 0, i, "recv", outputs=[torch.empty(4, 4)], peer=1, tag=7)

    def marks(n):
        for i in range(n):
            handle(c, 1, {"k": "mark", "label": f"{i:0200d}"}, b"")

    def stacks(n):
        for i in range(n):
            c.ranks[0].stacks = 0  # measure the stack itself, past the per-rank cap
            _wait(c, 0, i)

    assert _per_record(receives) <= cm.CALL_RECORD_BYTES
    assert _per_record(marks) <= cm.CALL_RECORD_BYTES
    assert _per_record(stacks) <= cm.STACK_BYTES
    assert len(c.ranks[0].blocked) == 5000 and all(c.ranks[0].blocked.values())
