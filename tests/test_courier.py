"""The courier without processes: frames fed to it by hand, its replies read back. What it
records (messages, sizes, peers, bytes), what it computes (allowed collectives), what it
refuses (collectives the lab does not allow, frames outside the protocol), and when it calls a
deadlock or a mismatch. Also the grader's file walks, the text sanitiser and the collectives'
arithmetic, which the rest of the grader builds on."""

from __future__ import annotations

import os
import struct
import threading

import pytest
import torch

from autograder.protocol import RankTraffic
from autograder.sandbox import files, reduce
from autograder.sandbox.channel import (FrameError, FrameReader, TreeTooLarge, make_tensor, pack,
                                        unpack, unpack_counted)
from autograder.sandbox.courier import Courier
from autograder.sandbox.courier_frames import handle
from autograder.sandbox.plan import CasePlan
from autograder.sanitize import printable


def courier(p: int = 2, allowed: frozenset = frozenset(), cases: int = 1) -> Courier:
    plan = [CasePlan(k, "call", {"world_size": p}, [torch.full((2,), float(r)) for r in range(p)])
            for k in range(cases)]
    c = Courier(p, plan, allowed, "torch's built-in {op} is not allowed in this lab")
    for rank in range(p):
        handle(c, rank, {"k": "hello", "confined": {}}, b"")
        handle(c, rank, {"k": "ready"}, b"")
    return c


def replies(c: Courier, rank: int) -> list[tuple[dict, bytes]]:
    reader = FrameReader()
    reader.feed(bytes(c.ranks[rank].outbox))
    c.ranks[rank].outbox.clear()
    return reader.frames()


def op(c: Courier, rank: int, op_id: int, name: str, tensors=(), outputs=(), **extra) -> None:
    specs, data, offset = [], b"", 0
    for t in tensors:
        raw = t.numpy().tobytes()
        specs.append([str(t.dtype).removeprefix("torch."), list(t.shape), offset, len(raw)])
        data += raw
        offset += len(raw)
    meta = {"k": "op", "id": op_id, "op": name, "group": list(range(c.world_size)), "tag": 0,
            "async": False, "inputs": specs,
            "outputs": [[str(t.dtype).removeprefix("torch."), list(t.shape)] for t in outputs],
            **extra}
    handle(c, rank, meta, data)


def test_a_message_is_matched_delivered_and_recorded():
    c = courier()
    assert [m["k"] for m, _ in replies(c, 0)] == ["case"]
    replies(c, 1)
    sent = torch.tensor([1.0, 2.0, 3.0])
    op(c, 0, 0, "send", [sent], peer=1)
    assert replies(c, 0) == []  # a send completes only when its receive is posted (as on gloo)
    op(c, 1, 0, "recv", outputs=[torch.empty(3)], peer=0)
    (done_send, _), = replies(c, 0)
    (done_recv, data), = replies(c, 1)
    assert done_send == {"k": "done", "id": 0, "outputs": []}
    assert done_recv["source"] == 0
    got = make_tensor(*done_recv["outputs"][0][:2], data)
    assert torch.equal(got, sent)
    t0, t1 = c.traffic_of(0), c.traffic_of(1)
    assert (t0.messages_sent, t0.bytes_sent) == (1, 12)
    assert (t1.messages_received, t1.bytes_received) == (1, 12)
    assert t0.sends[0].data == sent.numpy().tobytes() and t1.receives[0].peer == 0


def test_a_receive_from_any_rank_takes_the_first_send():
    c = courier(3)
    op(c, 2, 0, "send", [torch.ones(2)], peer=0)
    op(c, 0, 0, "recv", outputs=[torch.empty(2)], peer=-1)
    frames = [m for m, _ in replies(c, 0) if m["k"] == "done"]
    assert frames[0]["source"] == 2 and c.traffic_of(0).receives[0].peer == 2


def test_sizes_that_differ_are_a_mismatch():
    c = courier()
    op(c, 0, 0, "send", [torch.ones(5)], peer=1)
    op(c, 1, 0, "recv", outputs=[torch.empty(4)], peer=0)
    assert c.failure.kind == "mismatch"
    assert "rank 0 sent 20 bytes (5 float32) to rank 1, whose receive holds 16 bytes" \
        in c.failure.message


def test_sends_that_wait_for_each_other_are_a_deadlock():
    c = courier()
    for rank in (0, 1):
        op(c, rank, 0, "send", [torch.ones(2)], peer=1 - rank)
        assert not c.stuck()
    handle(c, 0, {"k": "wait", "id": 0, "stack": []}, b"")
    assert not c.stuck()  # rank 1 may still post the receive
    handle(c, 1, {"k": "wait", "id": 0, "stack": [["/x/collectives.py", 7, "exchange"]]}, b"")
    assert c.stuck()


def test_a_peer_that_returned_leaves_a_deadlock():
    c = courier()
    replies(c, 1)
    handle(c, 1, {"k": "output", "case": 0, "tree": pack(torch.ones(1))[0]},
           torch.ones(1).numpy().tobytes())
    assert c.ranks[1].finished
    op(c, 0, 0, "recv", outputs=[torch.empty(2)], peer=1)
    handle(c, 0, {"k": "wait", "id": 0, "stack": []}, b"")
    assert c.stuck()


def test_collectives_are_computed_when_allowed_and_refused_otherwise():
    c = courier(2, frozenset({"all_reduce"}))
    for rank in (0, 1):
        replies(c, rank)
        t = torch.tensor([1.0, 2.0]) * (rank + 1)
        op(c, rank, 0, "all_reduce", [t], [t], reduce="sum")
    for rank in (0, 1):
        (meta, data), = replies(c, rank)
        assert torch.equal(make_tensor(*meta["outputs"][0][:2], data), torch.tensor([3.0, 6.0]))
        kept, = c.traffic_of(rank).ops  # the input, as passed in, kept for the judges
        assert torch.equal(make_tensor(kept.dtype, list(kept.shape), kept.data),
                           torch.tensor([1.0, 2.0]) * (rank + 1))
    op(c, 0, 1, "broadcast", [torch.ones(2)], [torch.ones(2)], root=0)
    (meta, _), = replies(c, 0)
    assert meta["k"] == "fail" and "broadcast is not allowed" in meta["message"]
    assert [o.op for o in c.traffic_of(0).refused] == ["broadcast"]
    assert c.traffic_of(0).ops[-1].data is None  # a refused collective keeps nothing
    assert c.traffic_of(0).calls == {"all_reduce": 1, "broadcast": 1}


def test_collectives_that_differ_are_a_mismatch():
    c = courier(2, frozenset({"all_reduce", "broadcast"}))
    op(c, 0, 0, "all_reduce", [torch.ones(2)], [torch.ones(2)], reduce="sum")
    op(c, 1, 0, "broadcast", [torch.ones(2)], [torch.ones(2)], root=0)
    assert c.failure.kind == "mismatch" and "all_reduce" in c.failure.message


@pytest.mark.parametrize("meta, payload", [
    ({"k": "op", "id": 0, "op": "send", "group": [0, 1], "peer": 1,
      "inputs": [["float32", "lots", 0, 8]], "outputs": []}, bytes(8)),
    ({"k": "op", "id": 0, "op": "send", "group": [0, 1], "peer": 1,
      "inputs": [["float32", [4], 0, 16]], "outputs": []}, bytes(8)),
    ({"k": "op", "id": "0", "op": "send", "group": [0, 1], "peer": 1, "inputs": [],
      "outputs": []}, b""),
    ({"k": "op", "id": 0, "op": "send", "group": [1, 0], "peer": 1, "inputs": [],
      "outputs": []}, b""),
    ({"k": "op", "id": 0, "op": "rm -rf", "group": [0, 1]}, b""),
    ({"k": "output", "case": "0", "wchar": "lots", "tree": []}, b""),
    ({"k": "output", "case": 0, "tree": {"__tensor__": ["float32", [2], 0, 80]}}, bytes(8)),
    ({"k": "wait", "id": 99}, b""),
    ({"k": "mark", "label": ["not", "text"]}, b""),
    ({"k": "seize the grader"}, b""),
    # the second red team's (2026-11-24): zero bytes but extents torch cannot stride, a dtype
    # that is a JSON list (unhashable), the same in an output and in a collective's input
    ({"k": "op", "id": 0, "op": "send", "group": [0, 1], "peer": 1,
      "inputs": [["float32", [2**63, 0], 0, 0]], "outputs": []}, b""),
    ({"k": "output", "case": 0, "tree": {"__tensor__": ["float32", [2**63, 0], 0, 0]}}, b""),
    ({"k": "op", "id": 0, "op": "send", "group": [0, 1], "peer": 1,
      "inputs": [[["float32"], [1], 0, 4]], "outputs": []}, bytes(4)),
    ({"k": "output", "case": 0, "tree": {"__tensor__": [["float32"], [1], 0, 4]}}, bytes(4)),
    ({"k": "op", "id": 0, "op": "all_reduce", "group": [0, 1], "reduce": "sum",
      "inputs": [["float32", [2**40, 2**40, 0], 0, 0]], "outputs": []}, b""),
])
def test_frames_outside_the_protocol_are_tampering_not_a_crash(meta, payload):
    c = courier(allowed=frozenset({"all_reduce"}))
    handle(c, 0, meta, payload)
    assert c.failure is not None and c.failure.kind == "tampering" and c.failure.rank == 0


def test_an_error_no_check_foresaw_is_tampering_not_a_grader_failure(monkeypatch):
    """Whatever a frame makes the courier raise costs that rank's launch, never the grade."""
    from autograder.sandbox import courier_frames

    def broken(*_args):
        raise OverflowError("cannot convert")

    c = courier()
    monkeypatch.setattr(courier_frames, "_handle", broken)
    handle(c, 1, {"k": "mark", "label": "x"}, b"")
    assert c.failure.kind == "tampering" and c.failure.rank == 1
    assert "OverflowError: cannot convert" in c.failure.message


def test_results_are_capped_in_values_as_well_as_bytes():
    """A tree of empty lists carries no bytes but costs the grader ~70 B a node."""
    from autograder.sandbox.courier import RESULT_NODES

    c = courier()
    handle(c, 0, {"k": "output", "case": 0, "tree": [[] for _ in range(RESULT_NODES)]}, b"")
    assert c.failure.kind == "result_limit" and f"{RESULT_NODES:,} values" in c.failure.message
    c = courier()
    handle(c, 0, {"k": "output", "case": 0, "tree": [[] for _ in range(100)]}, b"")
    assert c.failure is None


def test_the_first_frame_must_be_the_ranks_hello():
    c = Courier(2, [], frozenset(), "")
    handle(c, 0, {"k": "ready"}, b"")
    assert c.failure.kind == "tampering"


def test_a_frame_header_over_the_caps_is_refused_before_reading():
    reader = FrameReader()
    reader.feed(struct.pack("<II", 2**32 - 1, 2**32 - 1))
    with pytest.raises(FrameError, match="over the caps"):
        reader.frames()


def test_trees_round_trip_and_refuse_lies():
    value = {"a": [torch.arange(3.0), 1, "x", None], "b": torch.ones(2, 2, dtype=torch.bfloat16)}
    tree, payload = pack(value)
    back = unpack(tree, payload)
    assert torch.equal(back["a"][0], value["a"][0]) and back["a"][1:] == [1, "x", None]
    assert torch.equal(back["b"], value["b"])
    with pytest.raises(FrameError):
        unpack({"__tensor__": ["float32", [10**9], 0, 8]}, bytes(8))
    with pytest.raises(FrameError):
        unpack({"__tensor__": ["pickle", [1], 0, 1]}, bytes(1))


def test_tensors_of_a_tree_must_name_bytes_of_their_own():
    """pack gives each tensor its own bytes; a hand-written tree whose nodes overlap would be
    decoded once per node (200 nodes on one 8 MiB payload: 1.6 GB), so it is refused before
    anything is built, and the decoded bytes are counted per tensor."""
    node = {"__tensor__": ["float32", [4], 0, 16]}
    with pytest.raises(FrameError, match="same bytes"):
        unpack_counted([node, node], bytes(16))
    with pytest.raises(FrameError, match="same bytes"):  # a partial overlap too
        unpack_counted([node, {"__tensor__": ["float32", [2], 8, 8]}], bytes(24))
    tree, payload = pack([torch.ones(4), torch.zeros(0), {"x": torch.arange(3)}])
    value, nodes, decoded = unpack_counted(tree, payload)
    assert decoded == 16 + 24 == len(payload) and nodes == 5
    with pytest.raises(TreeTooLarge) as err:
        unpack_counted(tree, payload, max_bytes=39)
    assert err.value.what == "bytes"
    with pytest.raises(TreeTooLarge) as err:
        unpack_counted([[]] * 10, b"", max_nodes=5)
    assert err.value.what == "values"


def test_sections_and_marks_split_a_ranks_calls():
    c = courier(2, frozenset({"all_reduce"}))
    handle(c, 0, {"k": "mark", "label": "sync0:begin"}, b"")
    op(c, 0, 0, "all_reduce", [torch.ones(2)], [torch.ones(2)], reduce="sum")
    handle(c, 0, {"k": "mark", "label": "graph_done0"}, b"")
    handle(c, 0, {"k": "mark", "label": "sync0:end"}, b"")
    op(c, 0, 1, "all_reduce", [torch.ones(3)], [torch.ones(3)], reduce="sum")
    t: RankTraffic = c.traffic_of(0)
    assert t.section("sync0").calls == {"all_reduce": 1}
    assert t.section("sync0").collective_bytes == 8 and t.collective_bytes == 20
    assert [o.nbytes for o in t.before("graph_done0")] == [8]
    assert t.position("graph_done0") == 2


def test_reduce_scatter_and_all_gather_single():
    inputs = [[torch.arange(4.0)], [torch.arange(4.0) * 10]]
    out = reduce.reduce_scatter_single(inputs, [[("float32", [2])]] * 2, how="sum")
    assert [o[0].tolist() for o in out] == [[0.0, 11.0], [22.0, 33.0]]
    gathered = reduce.all_gather_single([[torch.ones(2)], [torch.zeros(2)]],
                                        [[("float32", [4])]] * 2)
    assert gathered[1][0].tolist() == [1.0, 1.0, 0.0, 0.0]
    with pytest.raises(reduce.CollectiveError, match="equal"):
        reduce.reduce_scatter_single([[torch.ones(3)], [torch.ones(3)]],
                                     [[("float32", [1])]] * 2, how="sum")


def test_the_grader_walks_rank_folders_without_following_or_opening(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("the hidden checks")
    box = tmp_path / "box"
    box.mkdir()
    (box / "results.json").symlink_to(secret)
    os.mkfifo(box / "c0-p2.rank0.log")
    fd = os.open(box, os.O_RDONLY)
    for _ in range(1500):  # deeper than PATH_MAX allows by path
        os.mkdir("d" * 100, dir_fd=fd)
        nfd = os.open("d" * 100, os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nfd
    os.close(fd)
    for k in range(50):
        os.mkdir(box / f"e{k}")
    done = threading.Event()
    result = {}

    def walk() -> None:
        result["usage"] = files.scan(box, watch=("results.json",))
        files.remove(box)
        done.set()

    threading.Thread(target=walk, daemon=True).start()
    assert done.wait(120), "the walk blocked (a FIFO opened?)"
    usage = result["usage"]
    assert usage.named == ["results.json"] and usage.bytes == 0
    assert usage.entries == 1500 + 50 + 2 and usage.depth == 1500 and not usage.over
    assert not box.exists() and secret.read_text() == "the hidden checks"


def test_the_walk_stops_at_the_entry_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "MAX_ENTRIES", 100)  # 30,000 in the sandbox; fewer here
    for k in range(150):
        os.mkdir(tmp_path / f"d{k}")
    usage = files.scan(tmp_path)
    assert usage.over and usage.entries == 101


def test_escape_sequences_become_visible():
    text = "ok\n\x1b]0;title\x07\x1b[2J\ttab \u202eevil\x9b"
    assert printable(text) == "ok\n\\x1b]0;title\\x07\\x1b[2J\ttab \\u202eevil\\x9b"
