"""The recorder: exact bytes, peers and times for point-to-point ops and collectives."""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist

from toolkit import comm
from toolkit.comm import Event, InflightBoard, Trace
from toolkit.launch import spawn


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


# -- pure unit tests (no processes) ------------------------------------------------------------

def ev(rank, seq, op, peer, n, start=0.0, end=1.0):
    return Event(rank, seq, op, peer, n, "float32", (n // 4,), start, end)


def test_totals_split_p2p_and_collectives():
    trace = Trace([ev(0, 0, "send", 1, 400), ev(1, 0, "recv", 0, 400),
                   ev(0, 1, "isend", 1, 40), ev(0, 2, "all_reduce", None, 8),
                   ev(1, 1, "all_reduce", None, 8)])
    t = trace.totals()
    assert (t[0].bytes_sent, t[0].messages_sent, t[0].collective_bytes) == (440, 2, 8)
    assert (t[1].bytes_received, t[1].messages_received, t[1].bytes_sent) == (400, 1, 0)
    assert t[0].calls == {"send": 1, "isend": 1, "all_reduce": 1}
    assert trace.op_counts()["all_reduce"] == 2
    assert len(trace.where(rank=0)) == 3 and len(trace.where(op=["send", "recv"])) == 2


def test_relative_times_and_frame():
    trace = Trace([ev(0, 0, "send", 1, 4, 100.0, 100.5), ev(1, 0, "recv", 0, 4, 100.25, None)])
    rel = trace.relative()
    assert [e.start for e in rel] == [0.0, 0.25] and rel[0].end == 0.5 and rel[1].end is None
    df = trace.to_frame()
    assert list(df["op"]) == ["send", "recv"] and df.loc[0, "duration"] == 0.5
    assert str(df["peer"].dtype) == "Int64" and list(df["peer"]) == [1, 0]
    assert set(trace.totals_frame().index) == {0, 1}


def test_event_round_trips_as_tuple():
    e = ev(3, 7, "broadcast", 0, 16)
    assert Event.from_tuple(e.as_tuple()) == e and e.kind == "collective"
    assert ev(0, 0, "irecv", 1, 4).kind == "p2p"


def test_inflight_board_posts_and_describes(tmp_path):
    board = InflightBoard(str(tmp_path / "b"), 2, create=True)
    reader = InflightBoard(str(tmp_path / "b"), 2)
    assert reader.read(0) is None
    board.post(1, 5, "recv", 0, 4000, "float32")
    slot = reader.read(1)
    assert slot.active and slot.op == "recv" and slot.peer == 0 and slot.seq == 5
    assert slot.describe(slot.start + 2).startswith(
        "in recv from rank 0 (4,000 bytes, float32) for 2.0 s")
    board.done(1)
    assert not reader.read(1).active and "not in a communication call" in reader.read(1).describe()
    board.close()
    reader.close()


def test_wrappers_are_installed_once_and_originals_kept():
    comm.install()  # importing installs nothing (tests/test_imports.py); the launcher installs
    assert comm.is_installed()
    assert getattr(dist.all_reduce, "__toolkit_wrapped__", False)
    assert dist.all_reduce is dist.distributed_c10d.all_reduce
    assert not getattr(comm.original("all_reduce"), "__toolkit_wrapped__", False)
    before = dist.send
    comm.install()
    assert dist.send is before


def test_recording_rejects_a_negative_cap():
    with pytest.raises(ValueError, match="max_events"):
        with comm.recording(max_events=-1):
            pass


# -- multi-rank ----------------------------------------------------------------------------------

def p2p(rank, world_size):
    with comm.recording() as trace:
        if rank == 0:
            dist.send(torch.ones(1000), dst=1)            # 4,000 bytes
            dist.send(torch.ones(10, dtype=torch.float64), dst=1)
        else:
            dist.recv(torch.zeros(1000), src=0)
            dist.recv(torch.zeros(10, dtype=torch.float64))  # from any source
    return trace.to_records()


@pytest.mark.multirank
def test_send_and_recv_bytes_peers_and_dtypes():
    r0, r1 = spawn(p2p, 2, timeout=60)
    assert [(e["op"], e["peer"], e["nbytes"], e["dtype"]) for e in r0] == [
        ("send", 1, 4000, "float32"), ("send", 1, 80, "float64")]
    assert [(e["op"], e["peer"], e["nbytes"], e["dtype"]) for e in r1] == [
        ("recv", 0, 4000, "float32"), ("recv", 0, 80, "float64")]  # peer filled from recv's return
    assert all(e["end"] >= e["start"] and not e["async_op"] for e in r0 + r1)


def ring_isend(rank, world_size):
    send, recv = torch.full((256,), float(rank)), torch.zeros(256)
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    with comm.recording() as trace:
        reqs = [dist.isend(send, right), dist.irecv(recv, left)]
        assert all(e.end is None for e in trace)       # not finished until waited on
        for r in reqs:
            r.wait()
        ops = [dist.P2POp(dist.isend, send, right), dist.P2POp(dist.irecv, recv, left)]
        for r in dist.batch_isend_irecv(ops):
            r.wait()
    return recv[0].item(), [(e.op, e.peer, e.nbytes, e.async_op, e.end is not None) for e in trace]


@pytest.mark.multirank
def test_isend_irecv_and_batch_are_recorded_with_wait_times():
    out = spawn(ring_isend, 4, timeout=60)
    for rank, (got, events) in enumerate(out):
        right, left = (rank + 1) % 4, (rank - 1) % 4
        assert got == float(left)
        assert events == [("isend", right, 1024, True, True), ("irecv", left, 1024, True, True)] * 2


def collectives(rank, world_size):
    sub = dist.new_group([0, 1])
    x64 = torch.zeros(256, dtype=torch.float64)
    half = torch.ones(100, dtype=torch.float16)
    out = torch.zeros(world_size * 3)
    with comm.recording() as trace:
        dist.broadcast(x64, src=1)
        dist.all_reduce(half)
        dist.all_gather_into_tensor(out, torch.ones(3))  # calls all_gather_single inside
        dist.reduce_scatter_tensor(torch.zeros(3), torch.ones(3 * world_size))
        dist.barrier()
        if rank in (0, 1):
            dist.all_reduce(torch.ones(5), group=sub)
    return [(e.op, e.peer, e.nbytes, e.dtype, e.group) for e in trace]


@pytest.mark.multirank
def test_collectives_record_payload_root_and_group_once_each():
    out = spawn(collectives, 3, timeout=60)
    for rank, events in enumerate(out):
        expected = [
            ("broadcast", 1, 256 * 8, "float64", None),
            ("all_reduce", None, 100 * 2, "float16", None),
            ("all_gather_into_tensor", None, 3 * 4, "float32", None),
            ("reduce_scatter_tensor", None, 3 * 3 * 4, "float32", None),
            ("barrier", None, 0, "", None),
        ]
        if rank in (0, 1):
            expected.append(("all_reduce", None, 20, "float32", (0, 1)))
        assert events == expected


def local_block(rank, world_size):
    dist.all_reduce(torch.ones(1))                       # before: not recorded
    with comm.recording() as trace:
        dist.all_reduce(torch.ones(2))
    dist.all_reduce(torch.ones(3))                       # after: not recorded
    return [e.nbytes for e in trace], comm.active_traces()


@pytest.mark.multirank
def test_recording_in_a_rank_covers_only_its_block():
    assert spawn(local_block, 2, timeout=60) == [([8], []), ([8], [])]


def hello(rank, world_size):
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    if rank == 0:
        dist.send(torch.ones(25), dst=1)
    elif rank == 1:
        dist.recv(torch.zeros(25), src=0)
    return t.item()


@pytest.mark.multirank
def test_recording_around_spawn_merges_every_ranks_events():
    with comm.recording() as trace:
        assert spawn(hello, 4, timeout=60) == [6.0] * 4
    assert trace.ranks == [0, 1, 2, 3]
    assert trace.op_counts() == {"all_reduce": 4, "send": 1, "recv": 1}
    starts = [e.start for e in trace]
    assert starts == sorted(starts)
    totals = trace.totals()
    assert totals[0].bytes_sent == 100 and totals[1].bytes_received == 100
    assert all(totals[r].collective_bytes == 4 for r in range(4))
    # Nothing outside the block: a launch after it records nothing into it.
    spawn(hello, 2, timeout=60)
    assert len(trace) == 6


@pytest.mark.multirank
def test_no_recording_means_no_events_shipped():
    assert comm.active_traces() == []
    assert spawn(hello, 2, timeout=60) == [1.0, 1.0]


def many(rank, world_size):
    for _ in range(50):
        dist.all_reduce(torch.ones(1))
    return rank


@pytest.mark.multirank
def test_event_cap_counts_what_it_drops():
    with comm.recording(max_events=10) as trace:
        spawn(many, 2, timeout=60)
    assert len(trace) == 20  # 10 per rank, the cap each rank was given
    # Ranks drop the rest; the parent's trace keeps what arrived.


def slow_ops(rank, world_size, posted):
    if rank == 0:
        while not os.path.exists(posted):  # rank 1's receive has started
            time.sleep(0.005)
        time.sleep(0.2)  # rank 1 waits meanwhile
        dist.send(torch.ones(4), dst=1)
    else:
        work = dist.irecv(torch.zeros(4), src=0)
        open(posted, "w").close()
        work.wait()


@pytest.mark.multirank
def test_times_show_who_waited(tmp_path):
    # The order is made by the ranks, not by the scheduler: the receive starts, then rank 0
    # learns it has (a file), sleeps 0.2 s and sends; the receive ends once the data is there.
    with comm.recording() as trace:
        spawn(slow_ops, 2, str(tmp_path / "posted"), timeout=60)
    (send,) = trace.where(op="send")
    (recv,) = trace.where(op="irecv")
    assert recv.start < send.start <= recv.end
    assert recv.duration >= 0.2          # blocked until rank 0 sent


def fails_after_talking(rank, world_size):
    dist.all_reduce(torch.ones(2))
    if rank == 1:
        raise RuntimeError("after one all_reduce")
    # Rank 0 never reports: a second all_reduce here could fail with gloo's "connection closed"
    # once rank 1 is gone, and rank 0 would report its events before the launcher stops it.
    time.sleep(600)


@pytest.mark.multirank
def test_a_failed_launch_still_hands_over_what_reporting_ranks_recorded():
    from toolkit.launch import RankError

    with comm.recording() as trace:
        with pytest.raises(RankError):
            spawn(fails_after_talking, 2, timeout=60)
    # Rank 1 reported (with its events); rank 0 was stopped before it reported anything.
    assert [(e.rank, e.op, e.nbytes) for e in trace] == [(1, "all_reduce", 8)]


# -- values, offsets and matched messages ------------------------------------------------------

def _send_slices(rank, world_size):
    buf = torch.arange(10.0) + 100 * rank
    if rank == 0:
        dist.send(buf[2:5], dst=1)            # a slice: offset 2
        dist.isend(torch.zeros(50), dst=1).wait()  # longer than the values cap: no values kept
    else:
        dist.recv(buf[:3], src=0)
        dist.irecv(torch.empty(50), src=0).wait()
    return buf[:3].tolist()


def test_recording_keeps_values_offsets_and_pairs_messages():
    with comm.recording(values=8) as trace:
        got = spawn(_send_slices, 2, timeout=30)
    assert got[1] == [2.0, 3.0, 4.0]
    first, second = trace.messages()
    assert (first.src, first.dst, first.index, first.nbytes) == (0, 1, 0, 12)
    assert first.send.offset == 2 and first.send.values == (2.0, 3.0, 4.0)
    assert first.recv.offset == 0 and first.recv.values is None  # values are kept for sends
    assert second.index == 1 and second.send.values is None and second.end is not None
    assert trace.to_frame()["offset"].tolist()[:1] in ([2], [0])


def test_recording_without_values_keeps_none_and_rejects_negative():
    with comm.recording() as trace:
        spawn(_send_slices, 2, timeout=30)
    assert all(e.values is None for e in trace)
    with pytest.raises(ValueError, match="values"):
        with comm.recording(values=-1):
            pass


def test_messages_of_a_one_sided_trace_have_the_other_half_missing():
    trace = Trace([ev(0, 0, "send", 1, 4), ev(0, 1, "send", 1, 4)])
    msgs = trace.messages()
    assert [(m.index, m.recv) for m in msgs] == [(0, None), (1, None)]


# -- each recording keeps its own caps; what ranks drop reaches the parent ---------------------

def test_each_recording_keeps_values_only_up_to_its_own_cap():
    from toolkit.comm.recorder import Recorder

    rec, small, large, full = Recorder(), Trace(), Trace(), Trace()
    rec.start(small, max_events=10, values=2)
    rec.start(large, max_events=10, values=8)
    rec.start(full, max_events=1, values=8)
    sent = Event(0, 0, "send", 1, 12, "float32", (3,), 0.0, 1.0, values=(1.0, 2.0, 3.0))
    kept = rec.add(sent)
    assert small.events[0].values is None                 # 3 elements > its cap of 2
    assert large.events[0].values == (1.0, 2.0, 3.0) and full.events[0].values == (1.0, 2.0, 3.0)
    assert len(kept) == 3 and rec.add(sent) and full.dropped == 1 and len(full) == 1
    assert small.dropped == 0 and len(small) == 2


def _nested_value_caps(rank, world_size):
    with comm.recording(values=0) as plain:
        with comm.recording(values=8) as valued:
            if rank == 0:
                dist.send(torch.arange(3.0), dst=1)
                dist.isend(torch.arange(4.0), dst=1).wait()
            else:
                dist.recv(torch.zeros(3), src=0)
                dist.irecv(torch.zeros(4), src=0).wait()
    return ([(e.op, e.values, e.end is not None) for e in plain],
            [(e.op, e.values, e.end is not None) for e in valued])


@pytest.mark.multirank
def test_nested_recordings_in_a_rank_keep_their_own_values_cap():
    (plain, valued), _ = spawn(_nested_value_caps, 2, timeout=60)
    assert plain == [("send", None, True), ("isend", None, True)]       # asked for no values
    assert valued == [("send", (0.0, 1.0, 2.0), True), ("isend", (0.0, 1.0, 2.0, 3.0), True)]


@pytest.mark.multirank
def test_recordings_around_spawn_keep_their_own_caps_and_count_what_ranks_dropped():
    with comm.recording(max_events=5) as few:
        with comm.recording(max_events=10, values=8) as more:
            spawn(many, 2, timeout=60)                     # 50 all_reduces per rank
    assert len(more) == 20 and more.dropped == 80          # ranks kept 10 each (the larger cap)
    assert len(few) == 10 and few.dropped == 90            # its own cap: 5 per rank
    assert sorted(e.rank for e in few) == [0] * 5 + [1] * 5
    with comm.recording(values=0) as plain:
        with comm.recording(values=8) as valued:
            spawn(_send_slices, 2, timeout=30)
    assert [e.values for e in valued.where(op="send")] == [(2.0, 3.0, 4.0)]
    assert all(e.values is None for e in plain)
