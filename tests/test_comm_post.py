"""`toolkit.comm.post.post_p2p`: a message posted straight on the process group is recorded
exactly as ``dist.isend`` / ``dist.irecv`` record it, and falls back to those functions whenever
it could behave differently. The sliced ring posts every message this way."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from toolkit import collectives as C
from toolkit import comm
from toolkit.comm.post import post_p2p
from toolkit.launch import spawn

pytestmark = pytest.mark.multirank
TIMEOUT = 60


def _fields(e) -> tuple:
    """Everything an event says except when it happened and its number."""
    return (e.rank, e.op, e.peer, e.nbytes, e.dtype, e.shape, e.group, e.async_op, e.offset,
            e.values, e.end is not None)


def _one_way_then_the_other(rank, world_size):
    """The same two messages per rank, in the world and in a subgroup of ranks 0 and 2, once
    through torch's functions and once through `post_p2p`; both must record the same."""
    sub = dist.new_group([0, 2])
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    data = torch.arange(12, dtype=torch.float64) + 100 * rank
    got = {}
    with comm.recording(values=4) as trace:
        for how in ("dist", "post"):
            into = torch.zeros(3, dtype=torch.float64)
            if how == "dist":
                works = [dist.irecv(into, left), dist.isend(data[2:5], right)]
            else:
                works = [post_p2p("irecv", into, left, None, left),
                         post_p2p("isend", data[2:5], right, None, right)]
            for w in works:
                w.wait()
            got[how] = into.tolist()
            if rank in (0, 2):   # in the subgroup, global ranks 0, 2 are group ranks 0, 1
                other = 2 - rank
                into = torch.zeros(2, dtype=torch.float64)
                if how == "dist":
                    works = [dist.isend(data[:2], other, group=sub),
                             dist.irecv(into, other, group=sub)]
                else:
                    works = [post_p2p("isend", data[:2], other, sub, other // 2),
                             post_p2p("irecv", into, other, sub, other // 2)]
                for w in works:
                    w.wait()
                got[how + " sub"] = into.tolist()
    events = sorted(trace, key=lambda e: e.seq)
    half = len(events) // 2
    return got, [_fields(e) for e in events[:half]], [_fields(e) for e in events[half:]]


def test_a_posted_message_is_recorded_as_torchs_functions_record_it():
    for rank, (got, by_dist, by_post) in enumerate(spawn(_one_way_then_the_other, 3,
                                                         timeout=TIMEOUT)):
        left = (rank - 1) % 3
        assert got["dist"] == got["post"] == [100 * left + 2.0, 100 * left + 3, 100 * left + 4]
        assert by_post == by_dist
        ops = [(f[1], f[2], f[3]) for f in by_dist]
        assert ops[:2] == [("irecv", left, 24), ("isend", (rank + 1) % 3, 24)]
        if rank in (0, 2):
            assert got["dist sub"] == got["post sub"] == [100.0 * (2 - rank), 100 * (2 - rank) + 1]
            assert [f[6] for f in by_post] == [None, None, (0, 2), (0, 2)]
            # values kept for sends only; offsets: where in its storage each tensor starts
            assert [f[9] for f in by_post] == [None, (100.0 * rank + 2, 100.0 * rank + 3,
                                                      100.0 * rank + 4),
                                               (100.0 * rank, 100.0 * rank + 1), None]
            assert [f[8] for f in by_post] == [0, 2, 0, 0]
        else:
            assert len(by_post) == 2


def _through_a_replacement(rank, world_size):
    """Someone else replaced dist.isend / irecv: post_p2p must call theirs, not go around it."""
    calls = []
    originals = {name: getattr(dist, name) for name in ("isend", "irecv")}

    def spy(name):
        def fn(tensor, peer, group=None, tag=0):
            calls.append((name, peer))
            return originals[name](tensor, peer, group=group, tag=tag)
        return fn

    into = torch.zeros(4)
    try:
        for name in originals:
            setattr(dist, name, spy(name))
        works = [post_p2p("irecv", into, 1 - rank, None, 1 - rank),
                 post_p2p("isend", torch.full((4,), float(rank)), 1 - rank, None, 1 - rank)]
        for w in works:
            w.wait()
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)
    return calls, into.tolist()


def test_a_replaced_function_is_called_not_bypassed():
    for rank, (calls, got) in enumerate(spawn(_through_a_replacement, 2, timeout=TIMEOUT)):
        assert calls == [("irecv", 1 - rank), ("isend", 1 - rank)]
        assert got == [float(1 - rank)] * 4


def _unrecorded_and_complex(rank, world_size):
    """Without the wrappers nothing is recorded and the message still arrives; a complex tensor
    (torch sends it as real pairs) goes through torch's own function."""
    comm.uninstall()
    into = torch.zeros(2, dtype=torch.complex64)
    works = [post_p2p("irecv", into, 1 - rank, None, 1 - rank),
             post_p2p("isend", torch.full((2,), complex(rank, 1)), 1 - rank, None,
                            1 - rank)]
    for w in works:
        w.wait()
    plain = torch.zeros(3)
    w = [post_p2p("irecv", plain, 1 - rank, None, 1 - rank),
         post_p2p("isend", torch.full((3,), rank + 0.5), 1 - rank, None, 1 - rank)]
    for x in w:
        x.wait()
    return into.tolist(), plain.tolist(), comm.is_installed()


def test_posting_without_the_recorder_and_a_complex_tensor():
    for rank, (cplx, plain, installed) in enumerate(spawn(_unrecorded_and_complex, 2,
                                                          timeout=TIMEOUT)):
        assert cplx == [complex(1 - rank, 1)] * 2
        assert plain == [1 - rank + 0.5] * 3
        assert not installed


def _sliced_ring_order(rank, world_size, numel, window):
    with comm.recording() as trace:
        C.sliced_ring_all_reduce(torch.ones(numel), slice_bytes=4 * 10, window=window)
    return [(e.op, e.seq) for e in sorted(trace, key=lambda e: e.seq)]


@pytest.mark.parametrize("window, up_front", [(None, True), (2, False)])
def test_the_sliced_ring_posts_receives_ahead_of_its_sends(window, up_front):
    """Program order (the recorded call numbers, not times): with scratch for every
    reduce-scatter slice all 2(p−1)·S receives are posted before the first send; with 2 slots,
    2 reduce-scatter receives lead and the all-gather ones follow once every receive before them
    is posted."""
    p, numel = 4, 120               # chunks of 30 elements, slices of 10: S = 3
    units = 2 * (p - 1) * 3
    for ops in spawn(_sliced_ring_order, p, numel, window, timeout=TIMEOUT):
        names = [op for op, _ in ops]
        assert names.count("irecv") == names.count("isend") == units
        first_send = names.index("isend")
        if up_front:
            assert first_send == units and set(names[:units]) == {"irecv"}
        else:
            assert names[:first_send] == ["irecv", "irecv"]
