"""toolkit.collectives: same results as torch's built-ins, and the traffic the theory promises.

Each launch checks many cases inside the ranks and returns the ones that failed, so a few
launches (0.1 s each) cover every algorithm, world size 1-4, lengths divisible by p or not
(also shorter than p), several dtypes and reduce ops, and a subgroup.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from toolkit import collectives as C
from toolkit import comm
from toolkit.launch import RankError, spawn

pytestmark = pytest.mark.multirank
LENGTHS = (0, 1, 3, 7, 64, 1001)
TIMEOUT = 60


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    # bf16 keeps 8 bits of mantissa (ulp 2^-7 relative): sums of 4 values in another order
    # differ by a few ulps of the partial sums, so allow ~0.1 absolute there.
    rtol, atol = (5e-2, 1e-1) if a.dtype in (torch.bfloat16, torch.float16) else (1e-5, 1e-5)
    return a.shape == b.shape and a.dtype == b.dtype and torch.allclose(a, b, rtol=rtol, atol=atol)


def _compare_all(rank: int, world_size: int, group_ranks: list[int] | None) -> list[str]:
    """Every algorithm against torch's built-in; returns descriptions of the mismatches."""
    group = dist.new_group(group_ranks) if group_ranks is not None else None
    members = group_ranks if group_ranks is not None else list(range(world_size))
    if rank not in members:
        x = torch.ones(5)
        C.ring_all_reduce(x, group)  # a non-member returns without communicating
        return [] if torch.equal(x, torch.ones(5)) else ["non-member tensor changed"]
    p, me = len(members), members.index(rank)
    bad = []
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        for n in LENGTHS:
            gen = torch.Generator().manual_seed(1000 * rank + n)
            x = torch.randn(n, generator=gen).to(dtype)
            case = f"{dtype} n={n}"
            for op in ("sum", "avg", "max", "min"):
                ref = x.clone()
                dist.all_reduce(ref, op=getattr(dist.ReduceOp, op.upper()), group=group)
                for name, fn in C.ALGORITHMS["all_reduce"].items():
                    t = x.clone()
                    if fn(t, group, op=op) is not t or not _close(t, ref):
                        bad.append(f"all_reduce {name} {op} {case}")
            for src in members:
                ref = x.clone()
                dist.broadcast(ref, src, group=group)
                for name, fn in C.ALGORITHMS["broadcast"].items():
                    t = x.clone()
                    fn(t, src, group)
                    if not torch.equal(t, ref):
                        bad.append(f"broadcast {name} src={src} {case}")
                ref = x.clone()
                dist.reduce(ref, src, group=group)
                for name, fn in C.ALGORITHMS["reduce"].items():
                    t = x.clone()
                    fn(t, src, group)
                    want = ref if rank == src else x  # other ranks' tensors are left intact
                    if not _close(t, want):
                        bad.append(f"reduce {name} dst={src} {case}")
            sizes = C.chunk_sizes(n, p)
            summed = x.clone()
            dist.all_reduce(summed, group=group)
            out = torch.full((sizes[me],), float("nan"), dtype=dtype)
            before = x.clone()
            C.ring_reduce_scatter(out, x, group)
            if not _close(out, summed.split(sizes)[me]) or not torch.equal(x, before):
                bad.append(f"reduce_scatter {case}")
            full = torch.full((n,), float("nan"), dtype=dtype)
            C.ring_all_gather(full, summed.split(sizes)[me], group)
            if not torch.equal(full, summed):
                bad.append(f"all_gather {case}")
    # Matches torch's own tensor reduce-scatter / all-gather where p divides n.
    x = torch.arange(4.0 * p) * (rank + 1)
    ref = torch.empty(4)
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    reduce_scatter(ref, x, group=group)
    if not _close(C.ring_reduce_scatter(torch.empty(4), x, group), ref):
        bad.append("reduce_scatter vs reduce_scatter_tensor")
    ref = torch.empty(4 * p)
    (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(
        ref, x[:4].contiguous(), group=group)
    if not torch.equal(C.ring_all_gather(torch.empty(4 * p), x[:4], group), ref):
        bad.append("all_gather vs all_gather_into_tensor")
    # Scatter and gather, any root, 2-D tensors.
    for root in members:
        pieces = [torch.full((2, 3), 10.0 * i + root) for i in range(p)] if rank == root else None
        t = C.scatter(torch.empty(2, 3), pieces, src=root, group=group)
        if not torch.equal(t, torch.full((2, 3), 10.0 * me + root)):
            bad.append(f"scatter root={root}")
        mine = torch.full((2, 3), float(rank))
        into = [torch.empty(2, 3) for _ in range(p)] if rank == root else None
        C.gather(mine, into, dst=root, group=group)
        if rank == root and not all(torch.equal(into[i], torch.full((2, 3), float(members[i])))
                                    for i in range(p)):
            bad.append(f"gather root={root}")
    # In place on a non-contiguous tensor, and integer sum (product on integers too).
    t = torch.arange(12.0).reshape(3, 4).t() + rank
    ref = t.clone()
    dist.all_reduce(ref, group=group)
    if not _close(C.ring_all_reduce(t, group), ref):
        bad.append("non-contiguous ring_all_reduce")
    i = torch.arange(10, dtype=torch.int64) + rank
    ref = i.clone()
    dist.all_reduce(ref, op=dist.ReduceOp.PRODUCT, group=group)
    if not torch.equal(C.tree_all_reduce(i, group, op=dist.ReduceOp.PRODUCT), ref):
        bad.append("integer product tree_all_reduce")
    return bad


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_every_algorithm_matches_torch(world_size):
    failures = spawn(_compare_all, world_size, None, timeout=TIMEOUT)
    assert failures == [[]] * world_size


def test_subgroup_with_roots_given_as_global_ranks():
    failures = spawn(_compare_all, 4, [1, 2, 3], timeout=TIMEOUT)
    assert failures == [[]] * 4


# -- the sliced (pipelined) ring against the simple ring and torch ------------------------------

SLICES = (2, 3, 7)  # slices per chunk asked for; chunks here do not divide by them


def _slice_bytes(numel: int, p: int, dtype: torch.dtype, slices: int) -> int:
    """A slice size that cuts the largest chunk into about `slices` slices."""
    largest = max(C.chunk_sizes(numel, p))
    return torch.empty(0, dtype=dtype).element_size() * max(1, -(-largest // slices))


def _compare_sliced(rank: int, world_size: int, group_ranks: list[int] | None) -> list[str]:
    """Sliced ring vs simple ring (bit for bit) and torch (close), every op, several dtypes."""
    group = dist.new_group(group_ranks) if group_ranks is not None else None
    members = group_ranks if group_ranks is not None else list(range(world_size))
    if rank not in members:
        x = torch.ones(5)
        C.sliced_ring_all_reduce(x, group, slice_bytes=4)
        return [] if torch.equal(x, torch.ones(5)) else ["non-member tensor changed"]
    p, me = len(members), members.index(rank)
    bad = []
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.int32):
        ops = ("sum", "avg", "max", "min") if dtype.is_floating_point else ("sum", "max")
        for n in (0, 1, 5, 61, 1001):
            gen = torch.Generator().manual_seed(100 * rank + n)
            x = (torch.randn(n, generator=gen) * 8).to(dtype)
            sizes = C.chunk_sizes(n, p)
            for slices in SLICES:
                sb = _slice_bytes(n, p, dtype, slices)
                case = f"{dtype} n={n} slice_bytes={sb}"
                for op in ops:
                    simple, ref = x.clone(), x.clone()
                    C.ring_all_reduce(simple, group, op=op)
                    dist.all_reduce(ref, op=getattr(dist.ReduceOp, op.upper()), group=group)
                    t = x.clone()
                    if C.sliced_ring_all_reduce(t, group, op=op, slice_bytes=sb) is not t:
                        bad.append(f"all_reduce returns another tensor {case}")
                    if not torch.equal(t, simple) or not _close(t, ref):
                        bad.append(f"all_reduce {op} {case}")
                out = torch.full((sizes[me],), -1, dtype=dtype)
                want = torch.full((sizes[me],), -1, dtype=dtype)
                before = x.clone()
                C.sliced_ring_reduce_scatter(out, x, group, slice_bytes=sb)
                C.ring_reduce_scatter(want, x, group)
                if not torch.equal(out, want) or not torch.equal(x, before):
                    bad.append(f"reduce_scatter {case}")
                full = torch.full((n,), -1, dtype=dtype)
                base = torch.arange(n).to(dtype)  # the same on every rank
                C.sliced_ring_all_gather(full, base[: sizes[me]] + me, group, slice_bytes=sb)
                if not torch.equal(full, torch.cat([base[: sizes[i]] + i for i in range(p)])):
                    bad.append(f"all_gather {case}")
    t = torch.arange(12.0).reshape(3, 4).t() + rank  # non-contiguous, in place
    ref = t.clone()
    dist.all_reduce(ref, group=group)
    if not _close(C.sliced_ring_all_reduce(t, group, slice_bytes=8), ref):
        bad.append("non-contiguous sliced_ring_all_reduce")
    return bad


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_sliced_ring_matches_the_simple_ring_and_torch(world_size):
    failures = spawn(_compare_sliced, world_size, None, timeout=TIMEOUT)
    assert failures == [[]] * world_size


def test_sliced_ring_in_a_subgroup():
    failures = spawn(_compare_sliced, 4, [0, 2, 3], timeout=TIMEOUT)
    assert failures == [[]] * 4


def test_ring_slices_cut_the_largest_chunk():
    assert C.ring_slices(1000, 4, 4, slice_bytes=4 * 250) == 1      # chunks of 250 elements
    assert C.ring_slices(1001, 4, 4, slice_bytes=4 * 250) == 2      # the largest has 251
    assert C.ring_slices(16 << 20, 2, 4, slice_bytes=4 << 20) == 8  # 64 MiB: 32 MiB chunks
    assert C.ring_slices(0, 3, 4) == C.ring_slices(2, 3, 8) == 1
    with pytest.raises(ValueError, match="slice_bytes"):
        C.ring_slices(10, 2, 4, slice_bytes=0)


# -- traffic: recorded messages against the formulas -------------------------------------------

def _run(rank, world_size, algorithm, numel, kwargs):
    t = torch.ones(numel)
    C.get_algorithm(*algorithm)(t, **kwargs)
    return t[:1].tolist()


def _traffic(world_size, algorithm, numel=1000, **kwargs):
    with comm.recording() as trace:
        spawn(_run, world_size, algorithm, numel, kwargs, timeout=TIMEOUT)
    return trace


@pytest.mark.parametrize("p", [2, 3, 4])
@pytest.mark.parametrize("numel", [1000, 1001])
def test_ring_all_reduce_sends_2_p_minus_1_over_p_of_the_data(p, numel):
    trace = _traffic(p, ("all_reduce", "ring"), numel)
    sizes = C.chunk_sizes(numel, p)
    for r, tot in trace.totals().items():
        assert tot.messages_sent == tot.messages_received == 2 * (p - 1)
        # Rank r sends chunks r-1, r-2, ... (reduce-scatter) then r, r-1, ... (all-gather).
        rs = sum(sizes[(r - s - 1) % p] for s in range(p - 1))
        ag = sum(sizes[(r - s) % p] for s in range(p - 1))
        assert tot.bytes_sent == 4 * (rs + ag)
        if numel % p == 0:
            assert tot.bytes_sent == 2 * (p - 1) * 4 * numel // p
        assert set(e.peer for e in trace.where(rank=r, op="isend")) == {(r + 1) % p}
    total = sum(t.bytes_sent for t in trace.totals().values())
    assert total == 2 * (p - 1) * 4 * numel  # over all ranks: exactly 2(p-1)/p · X each on average
    assert not trace.where(op=["all_reduce", "broadcast", "reduce", "all_gather"]).events


@pytest.mark.parametrize("p", [2, 3, 4])
@pytest.mark.parametrize("numel, slices", [(1000, 4), (1001, 3), (2, 1)])
def test_sliced_ring_sends_the_simple_rings_bytes_in_more_messages(p, numel, slices):
    sb = _slice_bytes(numel, p, torch.float32, slices)
    S = C.ring_slices(numel, p, 4, slice_bytes=sb)
    trace = _traffic(p, ("all_reduce", "sliced_ring"), numel, slice_bytes=sb)
    simple = _traffic(p, ("all_reduce", "ring"), numel)
    assert S == min(slices, max(C.chunk_sizes(numel, p)))
    for r, tot in trace.totals().items():
        assert tot.messages_sent == tot.messages_received == 2 * (p - 1) * S
        assert tot.bytes_sent == simple.totals()[r].bytes_sent  # 2(p−1)/p · X, exactly
        assert tot.bytes_received == simple.totals()[r].bytes_received
        assert set(e.peer for e in trace.where(rank=r, op="isend")) == {(r + 1) % p}
    assert sum(t.bytes_sent for t in trace.totals().values()) == 2 * (p - 1) * 4 * numel
    assert not trace.where(op=["all_reduce", "broadcast", "reduce", "all_gather"]).events


def _halves(rank, world_size, numel, slice_bytes):
    sizes = C.chunk_sizes(numel, world_size)
    out = torch.empty(sizes[rank])
    C.sliced_ring_reduce_scatter(out, torch.ones(numel), slice_bytes=slice_bytes)
    full = torch.empty(numel)
    C.sliced_ring_all_gather(full, out, slice_bytes=slice_bytes)
    return full.sum().item()


@pytest.mark.parametrize("p", [2, 4])
def test_sliced_reduce_scatter_and_all_gather_traffic(p):
    numel, sb = 1001, 4 * 60  # chunks of 251 or 250 elements, slices of 60: S = 5
    S = C.ring_slices(numel, p, 4, slice_bytes=sb)
    with comm.recording() as trace:
        totals = spawn(_halves, p, numel, sb, timeout=TIMEOUT)
    assert totals == [float(p * numel)] * p
    for tot in trace.totals().values():
        # reduce-scatter then all-gather: each (p−1)·S messages, (p−1)/p·X bytes in all
        assert tot.messages_sent == 2 * (p - 1) * S
    total = sum(t.bytes_sent for t in trace.totals().values())
    assert total == 2 * (p - 1) * 4 * numel


@pytest.mark.parametrize("p", [2, 4])
def test_parameter_server_root_receives_p_minus_1_copies(p):
    X = 4 * 1000
    totals = _traffic(p, ("all_reduce", "ps")).totals()
    assert (totals[0].bytes_received, totals[0].bytes_sent) == ((p - 1) * X, (p - 1) * X)
    for r in range(1, p):
        assert (totals[r].bytes_sent, totals[r].bytes_received) == (X, X)


def test_sharded_parameter_server_moves_what_the_ring_moves():
    p, X = 4, 4 * 1000
    trace = _traffic(p, ("all_reduce", "sharded_ps"))
    for r, tot in trace.totals().items():
        assert tot.bytes_sent == tot.bytes_received == 2 * (p - 1) * X // p
        assert tot.messages_sent == 2 * (p - 1)
        # 2(p−1) rounds, as the model counts: every send is waited for before the next one
        # starts (program order, read from the recorded start and end of each call).
        sends = sorted(trace.where(rank=r, op="isend"), key=lambda e: e.seq)
        assert all(b.start >= a.end for a, b in zip(sends, sends[1:]))
        # step j goes to rank r + j: each phase visits every other rank once, in turn
        assert [e.peer for e in sends] == [(r + j) % p for j in range(1, p)] * 2


@pytest.mark.parametrize("p", [2, 3, 4])
def test_tree_broadcast_takes_log_p_rounds(p):
    X = 4 * 1000
    tree = _traffic(p, ("broadcast", "tree"), src=p - 1)
    linear = _traffic(p, ("broadcast", "linear"), src=p - 1)
    assert linear.totals()[p - 1].messages_sent == p - 1
    assert max(t.messages_sent for t in tree.totals().values()) == math.ceil(math.log2(p))
    for trace in (tree, linear):
        assert sum(t.bytes_sent for t in trace.totals().values()) == (p - 1) * X
        assert all(t.messages_received == (r != p - 1) for r, t in trace.totals().items())
    # Rounds: a rank's k-th send happens k rounds after it received. The last one is round
    # ⌈log₂p⌉, i.e. the set of ranks holding the data doubles every round.
    got_at = {p - 1: 0}
    for m in sorted(tree.messages(), key=lambda m: (m.send.start)):
        sends = sorted(tree.where(rank=m.src, op="isend"), key=lambda e: e.seq)
        got_at[m.dst] = got_at[m.src] + 1 + [e.seq for e in sends].index(m.send.seq)
    assert max(got_at.values()) == math.ceil(math.log2(p))


def test_tree_reduce_and_linear_reduce_traffic():
    p, X = 4, 4 * 1000
    linear = _traffic(p, ("reduce", "linear"), dst=0).totals()
    assert linear[0].bytes_received == (p - 1) * X and linear[0].messages_sent == 0
    tree = _traffic(p, ("reduce", "tree"), dst=0).totals()
    assert tree[0].messages_received == math.ceil(math.log2(p))
    assert all(tree[r].messages_sent == 1 for r in range(1, p))


# -- bad input: clear errors, before anything blocks ------------------------------------------

def _bad_call(rank, world_size, case):
    x = torch.ones(8)
    if case == "src outside":
        C.tree_broadcast(x, src=world_size)
    elif case == "avg on ints":
        C.ring_all_reduce(torch.ones(8, dtype=torch.int32), op="avg")
    elif case == "unknown op":
        C.ring_all_reduce(x, op="median")
    elif case == "wrong output":
        C.ring_reduce_scatter(torch.empty(3), x)
    elif case == "unknown algorithm":
        C.all_reduce(x, algorithm="butterfly")
    elif case == "sizes differ":
        C.ring_all_reduce(torch.ones(8 + (rank == 1)))
    elif case == "dtypes differ":
        C.tree_all_reduce(torch.ones(8, dtype=torch.float64 if rank == 1 else torch.float32))
    elif case == "roots differ":
        C.tree_broadcast(x, src=rank)
    elif case == "not a tensor":
        C.ring_all_reduce([1.0, 2.0])
    elif case == "sliced, not a tensor":
        C.sliced_ring_all_reduce([1.0, 2.0])
    elif case == "sliced, window 0":
        C.sliced_ring_reduce_scatter(torch.empty(4), x, window=0)
    elif case == "sliced, sizes differ":
        C.sliced_ring_all_gather(torch.empty(8 + 2 * rank), torch.empty(4 + rank))  # 8 vs 10


@pytest.mark.parametrize("case, words", [
    ("src outside", "src=2): rank 2 is not in the world"),
    ("avg on ints", "needs a floating-point tensor"),
    ("unknown op", "op='median') is not supported"),
    ("wrong output", "output has 3"),
    ("unknown algorithm", "'butterfly') is not one of ps, sharded_ps, tree, ring"),
    ("sizes differ", "ranks disagree"),
    ("dtypes differ", "float64"),
    ("roots differ", "root"),
    ("not a tensor", "must be a torch.Tensor"),
    ("sliced, not a tensor", "sliced_ring_all_reduce(tensor=...) must be a torch.Tensor"),
    ("sliced, window 0", "window=0 must be >= 1"),
    ("sliced, sizes differ", "ranks disagree"),
])
def test_bad_input_raises_a_clear_error(case, words):
    with pytest.raises(RankError) as info:
        spawn(_bad_call, 2, case, timeout=30)
    assert words in str(info.value)


def test_mismatch_is_found_before_any_payload_moves():
    """Rank 1 passes 9 elements, ranks 0 and 2 pass 8: ranks 1 and 2 each see a left
    neighbour that differs and raise before posting any payload. Rank 0's left neighbour
    (rank 2) agrees with it, so rank 0 may post its first send before the launch is stopped;
    whether it got that far is the scheduler's business and is not asserted."""
    with comm.recording() as trace:
        with pytest.raises(RankError):
            spawn(_bad_call, 3, "sizes differ", timeout=30)
    posted = trace.where(op=["isend", "irecv"])
    assert not posted.where(rank=1).events and not posted.where(rank=2).events, posted.events


def test_outside_a_rank_says_how_to_start_one():
    with pytest.raises(RuntimeError, match="toolkit.launch.spawn"):
        C.ring_all_reduce(torch.ones(3))


def test_chunk_sizes_follow_tensor_split():
    for n in range(0, 20):
        for p in range(1, 6):
            assert C.chunk_sizes(n, p) == [len(c) for c in torch.arange(n).tensor_split(p)]
            assert C.chunk_bounds(n, p)[-1][1] == n
    with pytest.raises(ValueError, match="parts"):
        C.chunk_sizes(4, 0)
