"""toolkit.context_parallel: ring attention and Ulysses equal full attention, and send what the
papers say.

The reference (`full_attention` on the whole sequence, one process) runs in the test process;
ranks return their output rows, their shards' gradients and what the recorder saw in forward
and backward separately. One launch per world size checks every case.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from toolkit import comm
from toolkit.context_parallel import (
    check_heads, full_attention, ring_attention, sequence_sizes, shard_sequence, ulysses_attention,
)
from toolkit.launch import spawn

pytestmark = pytest.mark.multirank
TIMEOUT = 60
B, NH, D = 2, 4, 8
FUNCS = {"ring": ring_attention, "ulysses": ulysses_attention}


def _inputs(s: int, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, NH, s, D, generator=gen) for _ in range(4))  # q, k, v, dOut


def _cases(p: int) -> list[tuple[str, int, bool]]:
    # s = 4p: divisible; s = 4p + p - 1: the last ranks one position short.
    return [(name, s, causal) for name in FUNCS for s in (4 * p, 5 * p - 1)
            for causal in (True, False)]


def _run(rank: int, world_size: int) -> dict:
    out: dict = {}
    for name, s, causal in _cases(world_size):
        q, k, v, dout = _inputs(s, seed=s)
        mine = [shard_sequence(t, rank, world_size).requires_grad_() for t in (q, k, v)]
        with comm.recording() as fwd:
            y = FUNCS[name](*mine, causal=causal, seq_len=s)
        with comm.recording() as bwd:
            y.backward(shard_sequence(dout, rank, world_size))
        out[name, s, causal] = dict(
            y=y.detach(), grads=[t.grad for t in mine],
            fwd=[(e.op, e.peer, e.nbytes) for e in fwd],
            bwd=[(e.op, e.peer, e.nbytes) for e in bwd])
    # Errors a rank sees before sending anything.
    errors = {}
    q = torch.zeros(1, world_size + 2, 4, 2)  # n_head = p + 2: divisible by p = 2, not by 4
    for key, call in (
        ("ulysses_heads", lambda: ulysses_attention(q, q, q)),
        ("ulysses_few_heads", lambda: ulysses_attention(*(torch.zeros(1, 1, 4, 2),) * 3)),
        ("wrong_share", lambda: ring_attention(*(torch.zeros(1, 2, 3, 2),) * 3, seq_len=100)),
    ):
        try:
            call()
            errors[key] = None
        except ValueError as e:
            errors[key] = str(e)
    if world_size == 4:  # two context-parallel groups of 2: the ring stays inside each
        groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        q, k, v, _ = _inputs(6, seed=1)
        sub = rank % 2
        mine = [shard_sequence(t, sub, 2) for t in (q, k, v)]
        with comm.recording() as tr:
            y = ring_attention(*mine, group=groups[rank // 2])
        out["subgroup"] = (y, [(e.op, e.peer) for e in tr])
    return {"cases": out, "errors": errors}


@pytest.mark.parametrize("world_size", [2, 4])
def test_equal_full_attention_forward_backward_and_traffic(world_size: int) -> None:
    p = world_size
    results = spawn(_run, p, timeout=TIMEOUT)
    for name, s, causal in _cases(p):
        where = f"{name} p={p} s={s} causal={causal}"
        q, k, v, dout = _inputs(s, seed=s)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        ref = full_attention(*leaves, causal=causal)
        ref.backward(dout)
        got = [r["cases"][name, s, causal] for r in results]
        torch.testing.assert_close(torch.cat([g["y"] for g in got], 2), ref.detach(),
                                   rtol=1e-4, atol=1e-5, msg=lambda m, where=where: f"{where}: {m}")
        for i, leaf in enumerate(leaves):
            torch.testing.assert_close(torch.cat([g["grads"][i] for g in got], 2), leaf.grad,
                                       rtol=1e-4, atol=1e-5,
                                       msg=lambda m, where=where, i=i: f"{where} grad {i}: {m}")
        sizes = sequence_sizes(s, p)
        block = [2 * B * NH * n * D * 4 for n in sizes]  # bytes of one (k, v) block of rank j
        for r, g in enumerate(got):
            if name == "ring":
                # Forward: p - 1 sends to the right neighbour, blocks r, r-1, ... (not r+1).
                want = [("isend", (r + 1) % p, block[(r - t) % p]) for t in range(p - 1)]
                assert [e for e in g["fwd"] if e[0] == "isend"] == want, where
                assert sum(e[0] == "irecv" for e in g["fwd"]) == p - 1, where
                # Backward: the p - 1 blocks again, and p gradient blocks, the last one home.
                sends = [e for e in g["bwd"] if e[0] == "isend"]
                assert len(sends) == 2 * p - 1 and {e[1] for e in sends} == {(r + 1) % p}, where
                assert sum(e[2] for e in sends) == sum(block[(r - t) % p] for t in range(p - 1)) \
                    + sum(block), where
            else:
                # Forward: q, k, v to head shards (3·b·nh·s_r·d floats), the output back
                # (b·nh/p·s·d floats); backward the same two, reversed.
                qkv, back = 3 * B * NH * sizes[r] * D * 4, B * (NH // p) * s * D * 4
                assert g["fwd"] == [("all_to_all_single", None, qkv),
                                    ("all_to_all_single", None, back)], where
                assert g["bwd"] == [("all_to_all_single", None, B * NH * sizes[r] * D * 4),
                                    ("all_to_all_single", None, 3 * B * (NH // p) * s * D * 4)], \
                    where
    for res in results:
        err = res["errors"]
        if (p + 2) % p:  # p = 4: 6 heads cannot be split over 4 ranks
            assert "n_head=6 is not divisible by p=4" in err["ulysses_heads"], err
        assert f"p={p} ranks exceeds n_head=1" in err["ulysses_few_heads"], err
        assert "capped at n_head" in err["ulysses_few_heads"], err
        assert "seq_len=100" in err["wrong_share"] and "shard_sequence" in err["wrong_share"], err
    if p == 4:
        q, k, v, _ = _inputs(6, seed=1)
        ref = full_attention(q, k, v)
        for pair in ((0, 1), (2, 3)):
            ys = [results[r]["cases"]["subgroup"][0] for r in pair]
            torch.testing.assert_close(torch.cat(ys, 2), ref, rtol=1e-4, atol=1e-5)
            for r in pair:
                other = pair[1 - pair.index(r)]
                assert results[r]["cases"]["subgroup"][1] == [("isend", other), ("irecv", other)]


def test_one_process_and_pure_helpers() -> None:
    assert not dist.is_initialized()
    q, k, v, _ = _inputs(5, seed=3)
    for fn in FUNCS.values():  # without a process group: one rank, the whole sequence
        torch.testing.assert_close(fn(q, k, v), full_attention(q, k, v), rtol=1e-5, atol=1e-6)
    # The online softmax is exact in float32 also for large logits (it subtracts the max).
    big = 30 * q
    torch.testing.assert_close(ring_attention(big, k, v), full_attention(big, k, v),
                               rtol=1e-4, atol=1e-5)
    split = [len(c) for c in torch.arange(10).tensor_split(4)]
    assert sequence_sizes(10, 4) == [3, 3, 2, 2] == split
    assert shard_sequence(torch.arange(10).view(1, 1, 10, 1), 2, 4).flatten().tolist() == [6, 7]
    assert check_heads(8, 4) == 2
    with pytest.raises(ValueError, match="capped at n_head"):
        check_heads(4, 8)
    with pytest.raises(ValueError, match="n_head=6 is not divisible by p=4"):
        check_heads(6, 4)
    with pytest.raises(ValueError, match="at least one position"):
        sequence_sizes(3, 4)
    with pytest.raises(ValueError, match="one shape"):
        ring_attention(q, k[:, :2], v)
    with pytest.raises(RuntimeError, match="not initialised"):
        ulysses_attention(q, k, v, group=object())
