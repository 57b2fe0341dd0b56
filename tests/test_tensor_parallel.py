"""toolkit.tensor_parallel: the same numbers as the dense modules, and Megatron's traffic.

The dense reference (TinyGPT's MLP and attention, biases randomised so that a bias added p times
would show) runs here, in the test process. Ranks return their outputs, input gradients and
parameter-gradient *shards*; the test reassembles the shards (column-parallel: rows of the
weight, row-parallel: columns) and compares them with the dense gradients. Each launch checks
many things, so the file runs in a few seconds.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from toolkit import comm
from toolkit.launch import spawn
from toolkit.models import GPTConfig, TinyGPT, TinyMLP
from toolkit.tensor_parallel import (
    ColumnParallelLinear, ParallelMLP, ParallelSelfAttention, RowParallelLinear,
    copy_to_tensor_parallel, gather_from_sequence_parallel, gather_from_tensor_parallel,
    reduce_from_tensor_parallel, reduce_scatter_to_sequence_parallel, scatter_to_tensor_parallel,
    shard, sync_sequence_parallel_grads,
)

pytestmark = pytest.mark.multirank
TIMEOUT = 60
CFG = GPTConfig(vocab_size=16, seq_len=8, d_model=16, n_head=4, n_layer=1, d_ff=32)
B, S, H = 2, 8, CFG.d_model
COLUMN = ("up_proj", "q_proj", "k_proj", "v_proj")  # split by output features: weight rows
ROW = ("down_proj", "out_proj")                    # split by input features: weight columns
TOL = dict(rtol=1e-4, atol=1e-5)


def _randn(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _linear(d_in: int, d_out: int, seed: int) -> nn.Linear:
    """The same dense layer on every rank (spawn seeds each rank's global RNG differently)."""
    layer = nn.Linear(d_in, d_out)
    with torch.no_grad():
        layer.weight.copy_(_randn(seed, d_out, d_in))
        layer.bias.copy_(_randn(seed + 1, d_out))
    return layer


def _dense_blocks() -> dict[str, nn.Module]:
    """TinyGPT's MLP and attention with every parameter random (TinyGPT zeroes its biases)."""
    block = TinyGPT(CFG).blocks[0]
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=gen))
    return {"mlp": block.mlp, "attn": block.attn}


def _dense_run(module: nn.Module) -> dict:
    x = _randn(1, B, S, H).requires_grad_()
    y = module(x)
    (y * _randn(2, B, S, H)).sum().backward()
    grads = {n: p.grad.clone() for n, p in module.named_parameters()}
    module.zero_grad()
    return {"out": y.detach(), "x_grad": x.grad, "grads": grads}


def _ops(trace: comm.Trace) -> list[tuple]:
    return [(e.op, e.shape, e.nbytes) for e in trace]


# --- the blocks against the dense modules ------------------------------------------------------


def _blocks(rank: int, world_size: int, dense: dict[str, nn.Module]) -> dict:
    out = {}
    for kind, cls in (("mlp", ParallelMLP), ("attn", ParallelSelfAttention)):
        for sp in (False, True):
            tp = cls.from_dense(dense[kind], sequence_parallel=sp)
            x, w = _randn(1, B, S, H), _randn(2, B, S, H)
            if sp:  # each rank holds its positions of the sequence
                x, w = shard(x, 1), shard(w, 1)
            x = x.clone().requires_grad_()
            with comm.recording() as fwd:
                y = tp(x)
            with comm.recording() as bwd:
                (y * w).sum().backward()
            partial = {n: p.grad.clone() for n, p in tp.named_parameters()}
            synced = sync_sequence_parallel_grads(tp)
            out[kind, sp] = {
                "out": y.detach(), "x_grad": x.grad, "partial": partial, "synced": synced,
                "grads": {n: p.grad for n, p in tp.named_parameters()},
                "fwd": _ops(fwd), "bwd": _ops(bwd),
            }
    return out


def _assemble(name: str, shards: list[torch.Tensor]) -> torch.Tensor:
    """The dense tensor from the ranks' shards, by the Megatron split of each layer."""
    layer, kind = name.split(".")
    if layer in COLUMN:
        return torch.cat(shards, dim=0)  # (o/p, h) x p -> (o, h); biases (o/p,) x p -> (o,)
    if kind == "weight":
        return torch.cat(shards, dim=1)  # (o, i/p) x p -> (o, i)
    for s in shards[1:]:  # a row-parallel bias is replicated: the same on every rank
        torch.testing.assert_close(s, shards[0], rtol=0, atol=0)
    return shards[0]


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_blocks_match_dense_and_send_one_all_reduce_each_way(world_size: int) -> None:
    dense = _dense_blocks()
    with comm.recording() as trace:
        results = spawn(_blocks, world_size, dense, timeout=TIMEOUT)
    n = B * S * H * 4  # bytes of one (b, s, h) float32 activation
    shard_shape = (B, S // world_size, H)
    for kind in ("mlp", "attn"):
        ref = _dense_run(dense[kind])
        for sp in (False, True):
            got = [r[kind, sp] for r in results]
            where = f"{kind} sequence_parallel={sp} p={world_size}"
            if sp:  # outputs and input gradients are sequence shards: concatenate them
                torch.testing.assert_close(torch.cat([g["out"] for g in got], 1), ref["out"], **TOL)
                torch.testing.assert_close(torch.cat([g["x_grad"] for g in got], 1),
                                           ref["x_grad"], **TOL)
            else:  # replicated: every rank holds all of it
                for g in got:
                    torch.testing.assert_close(g["out"], ref["out"], **TOL)
                    torch.testing.assert_close(g["x_grad"], ref["x_grad"], **TOL)
            assert set(got[0]["grads"]) == set(ref["grads"]), where
            for name, want in ref["grads"].items():
                torch.testing.assert_close(_assemble(name, [g["grads"][name] for g in got]),
                                           want, **TOL,
                                           msg=lambda m, w=where, n=name: f"{w} {n}: {m}")
            row_bias = [f"{layer}.bias" for layer in ROW if f"{layer}.bias" in ref["grads"]]
            if sp:  # before the sync, each rank's row bias saw only its positions: they sum up
                assert all(g["synced"] == 1 for g in got), where
                for name in row_bias:
                    total = sum(g["partial"][name] for g in got)
                    torch.testing.assert_close(total, ref["grads"][name], **TOL)
                # Korthikanti: all-gather + reduce-scatter forward, and the reverse in backward.
                assert all(g["fwd"] == [("all_gather", shard_shape, n // world_size),
                                        ("reduce_scatter", shard_shape, n)] for g in got), where
                assert all(g["bwd"] == [("all_gather", shard_shape, n // world_size),
                                        ("reduce_scatter", shard_shape, n)] for g in got), where
            else:  # Megatron: g's all-reduce forward, f's all-reduce backward, b·s·h each
                assert all(g["synced"] == 0 for g in got), where
                assert all(g["fwd"] == [("all_reduce", (B, S, H), n)] for g in got), where
                assert all(g["bwd"] == [("all_reduce", (B, S, H), n)] for g in got), where
    # The same seen from the parent: per rank, 2 blocks x (1 fwd + 1 bwd) all-reduces of b·s·h,
    # plus one all-reduce of a bias gradient per sequence-parallel block (sync).
    for rank, totals in trace.totals().items():
        assert totals.calls == {"all_reduce": 6, "all_gather": 4, "reduce_scatter": 4}, rank
        shapes = sorted(e.shape for e in trace.where(rank=rank, op="all_reduce"))
        assert shapes == sorted([(B, S, H)] * 4 + [(H,)] * 2)
    assert trace.ranks == list(range(world_size))


# --- the operators, the linear layers' options, subgroups, errors --------------------------------


def _operators(rank: int, world_size: int) -> tuple:
    """Runs every check in the rank; returns what failed (empty: a pass) and fresh shards."""
    bad: list[str] = []
    p, r = world_size, rank

    def check(ok: bool, what: str) -> None:
        if not ok:
            bad.append(what)

    def close(a: torch.Tensor, b: torch.Tensor) -> bool:
        return a.shape == b.shape and torch.allclose(a, b, **TOL)

    def run(op, x: torch.Tensor, grad: torch.Tensor) -> tuple:
        x = x.clone().requires_grad_()
        before = x.detach().clone()
        with comm.recording() as fwd:
            y = op(x)
        with comm.recording() as bwd:
            y.backward(grad)
        check(torch.equal(x.detach(), before), f"{op.__name__} changed its input")
        return y.detach(), x.grad, [e.op for e in fwd], [e.op for e in bwd]

    mine = [_randn(100 + q, 2, 3, 4) for q in range(p)]  # rank q's tensor, known to every rank
    grads = [_randn(200 + q, 2, 3, 4) for q in range(p)]
    total = sum(mine)

    # f: identity forward, all-reduce (sum of every rank's gradient) backward.
    y, gx, fo, bo = run(copy_to_tensor_parallel, mine[r], grads[r])
    check(torch.equal(y, mine[r]) and close(gx, sum(grads)), "f values")
    check(fo == [] and bo == ["all_reduce"], f"f traffic {fo} {bo}")
    # g: all-reduce forward, identity backward.
    y, gx, fo, bo = run(reduce_from_tensor_parallel, mine[r], grads[r])
    check(close(y, total) and torch.equal(gx, grads[r]), "g values")
    check(fo == ["all_reduce"] and bo == [], f"g traffic {fo} {bo}")
    # Last-dimension gather (gather_output) and scatter (input_is_parallel=False).
    y, gx, fo, bo = run(gather_from_tensor_parallel, mine[r], torch.cat(grads, -1))
    check(close(y, torch.cat(mine, -1)) and torch.equal(gx, grads[r]), "gather(h) values")
    check(fo == ["all_gather"] and bo == [], f"gather(h) traffic {fo} {bo}")
    y, gx, fo, bo = run(scatter_to_tensor_parallel, torch.cat(mine, -1), grads[r])
    check(torch.equal(y, mine[r]) and close(gx, torch.cat(grads, -1)), "scatter(h) values")
    check(fo == [] and bo == ["all_gather"], f"scatter(h) traffic {fo} {bo}")
    # Sequence parallel: all-gather / reduce-scatter along dim 1, and the reverse.
    long = [torch.cat([_randn(300 + 10 * q + j, 2, 3, 4) for j in range(p)], 1) for q in range(p)]
    y, gx, fo, bo = run(gather_from_sequence_parallel, mine[r], long[r])
    check(close(y, torch.cat(mine, 1)) and close(gx, sum(long).chunk(p, 1)[r]), "gather(s)")
    check(fo == ["all_gather"] and bo == ["reduce_scatter"], f"gather(s) traffic {fo} {bo}")
    y, gx, fo, bo = run(reduce_scatter_to_sequence_parallel, long[r], grads[r])
    check(close(y, sum(long).chunk(p, 1)[r]) and close(gx, torch.cat(grads, 1)), "rs(s)")
    check(fo == ["reduce_scatter"] and bo == ["all_gather"], f"rs(s) traffic {fo} {bo}")

    # The linear layers on their own, with the options that make them dense-in, dense-out.
    dense = _linear(8, 12, seed=20)
    x = _randn(5, 2, 3, 8)

    def dense_grads(layer: nn.Module, x: torch.Tensor) -> tuple:
        x = x.clone().requires_grad_()
        y = layer(x)
        y.backward(_randn(6, *y.shape))
        out = (y.detach(), x.grad, layer.weight.grad.clone(), layer.bias.grad.clone())
        layer.zero_grad()
        return out

    y0, gx0, gw0, gb0 = dense_grads(dense, x)
    col = ColumnParallelLinear.from_dense(dense, gather_output=True)
    y, gx, gw, gb = dense_grads(col, x)
    check(close(y, y0) and close(gx, gx0), "column gather_output values")
    check(close(gw, shard(gw0, 0)) and close(gb, shard(gb0, 0)), "column gather_output grads")
    check(col.weight.shape == (12 // p, 8), f"column shard shape {tuple(col.weight.shape)}")
    y = ColumnParallelLinear.from_dense(dense)(x)
    check(close(y, shard(y0, -1)), "column output is this rank's features")
    dense_row = _linear(12, 8, seed=30)
    x = _randn(8, 2, 3, 12)
    y0, gx0, gw0, gb0 = dense_grads(dense_row, x)
    row = RowParallelLinear.from_dense(dense_row, input_is_parallel=False)
    y, gx, gw, gb = dense_grads(row, x)
    check(close(y, y0) and close(gx, gx0), "row input_is_parallel=False values")
    check(close(gw, shard(gw0, 1)) and close(gb, gb0), "row input_is_parallel=False grads")
    y = RowParallelLinear.from_dense(dense_row)(shard(x, -1))
    check(close(y, y0), "row with a parallel input")

    if p == 4:  # two tensor-parallel groups of 2 (tp=2 x dp=2): collectives stay in the group
        groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        mlp = TinyMLP(d_in=8, d_hidden=16, d_out=8, depth=1, seed=3)
        tp = ParallelMLP.from_dense(mlp, group=groups[r // 2])
        with comm.recording() as trace:
            y = tp(_randn(9, 2, 8))
        check(close(y, mlp(_randn(9, 2, 8))), "subgroup MLP output")
        check(tp.up_proj.weight.shape == (8, 8), "subgroup shard is 1/2, not 1/4")
        want = (0, 1) if r < 2 else (2, 3)
        check([(e.op, e.group) for e in trace] == [("all_reduce", want)], f"subgroup {trace}")

    if p > 1:  # sizes the group cannot split evenly, each caught before any communication
        cases = [
            (f"out_features={4 * p + 1}", lambda: ColumnParallelLinear(8, 4 * p + 1)),
            (f"in_features={2 * p + 1}", lambda: RowParallelLinear(2 * p + 1, 8)),
            (f"n_head={p + 1}", lambda: ParallelSelfAttention(4 * (p + 1), p + 1)),
            (f"d_ff={2 * p + 1}", lambda: ParallelMLP(8, 2 * p + 1)),
            (f"seq={p + 1}", lambda: shard(torch.zeros(2, p + 1, 3), 1, what="seq")),
        ]
        for key, make in cases:
            try:
                make()
                bad.append(f"no error for {key}")
            except ValueError as e:
                check(key in str(e) and f"tensor-parallel size {p}" in str(e), f"message: {e}")
        try:  # a full-width input where this rank's features were expected
            RowParallelLinear(8, 4)(torch.zeros(2, 8))
            bad.append("no error for a full-width input")
        except ValueError as e:
            check(f"in_features / tp (input_is_parallel=True)={8 // p}" in str(e), f"message: {e}")

    # Fresh layers and blocks: each rank keeps its slice of the same full draw, so they are the
    # same model at every group size (the test compares them with one process's).
    fresh = (ColumnParallelLinear(8, 12, seed=3), RowParallelLinear(12, 8, seed=3))
    blocks = (ParallelMLP(H, 2 * H, seed=5), ParallelSelfAttention(H, 4, seed=5))
    x = _randn(10, 2, 4, H).requires_grad_()
    with comm.recording() as trace:
        outs = [m(x) for m in blocks]
        sum(o.sum() for o in outs).backward()
    check([e.op for e in trace] == ["all_reduce"] * 4, f"fresh blocks traffic {trace}")
    layers = [(m.weight.detach(), m.bias.detach()) for m in fresh]
    return bad, layers, ([o.detach() for o in outs], x.grad)


def _fresh_reference() -> tuple:
    """`_operators`' fresh blocks in this process (no process group: one whole rank)."""
    blocks = (ParallelMLP(H, 2 * H, seed=5), ParallelSelfAttention(H, 4, seed=5))
    x = _randn(10, 2, 4, H).requires_grad_()
    outs = [m(x) for m in blocks]
    sum(o.sum() for o in outs).backward()
    return outs, x.grad


@pytest.mark.parametrize("world_size", [2, 4])
def test_operators_layers_subgroups_and_errors(world_size: int) -> None:
    results = spawn(_operators, world_size, timeout=TIMEOUT)
    for rank, (bad, *_) in enumerate(results):
        assert bad == [], f"rank {rank}: {bad}"
    # Without a process group the layers are whole: the reference for the assembled shards.
    col, row = ColumnParallelLinear(8, 12, seed=3), RowParallelLinear(12, 8, seed=3)
    shards = [fresh for _, fresh, _ in results]
    torch.testing.assert_close(torch.cat([s[0][0] for s in shards], 0), col.weight.detach())
    torch.testing.assert_close(torch.cat([s[0][1] for s in shards], 0), col.bias.detach())
    torch.testing.assert_close(torch.cat([s[1][0] for s in shards], 1), row.weight.detach())
    for s in shards:
        torch.testing.assert_close(s[1][1], row.bias.detach())
    (outs, x_grad) = _fresh_reference()
    for _, _, (got, got_grad) in results:
        for a, b in zip(got, outs):
            torch.testing.assert_close(a, b.detach(), **TOL)
        torch.testing.assert_close(got_grad, x_grad, **TOL)


# --- one process, no process group ---------------------------------------------------------------


def test_without_process_group_the_blocks_are_the_dense_ones() -> None:
    assert not dist.is_initialized()
    for kind, cls in (("mlp", ParallelMLP), ("attn", ParallelSelfAttention)):
        dense = _dense_blocks()[kind]
        ref, tp = _dense_run(dense), cls.from_dense(dense)
        got = _dense_run(tp)
        torch.testing.assert_close(got["out"], ref["out"], **TOL)
        torch.testing.assert_close(got["x_grad"], ref["x_grad"], **TOL)
        for name, g in ref["grads"].items():
            torch.testing.assert_close(got["grads"][name], g, **TOL)
    # TinyMLP(depth=1) is [Linear, ReLU, Linear]; a frozen dense weight stays frozen.
    mlp = TinyMLP(d_in=4, d_hidden=8, d_out=4, depth=1)
    mlp.layers[0].weight.requires_grad_(False)
    tp = ParallelMLP.from_dense(mlp)
    assert isinstance(tp.act, nn.ReLU) and not tp.up_proj.weight.requires_grad
    x = _randn(3, 5, 4)
    torch.testing.assert_close(tp(x), mlp(x))
    assert tp.up_proj.weight.data_ptr() != mlp.layers[0].weight.data_ptr()  # a copy, not shared
    # A fresh block of the same sizes runs too.
    assert ParallelSelfAttention(16, 4)(x.new_zeros(2, 3, 16)).shape == (2, 3, 16)


def test_bad_arguments_are_refused_clearly() -> None:
    with pytest.raises(TypeError, match="nn.Linear"):
        ColumnParallelLinear.from_dense(nn.Conv1d(2, 2, 1))
    with pytest.raises(TypeError, match="TinyMLP"):
        ParallelMLP.from_dense(TinyMLP(depth=2))  # three Linears: not one column/row pair
    with pytest.raises(TypeError, match="CausalSelfAttention"):
        ParallelSelfAttention.from_dense(nn.Linear(4, 4))
    dropout = TinyGPT(GPTConfig(n_layer=1, dropout=0.1)).blocks[0]
    for cls, module in ((ParallelMLP, dropout.mlp), (ParallelSelfAttention, dropout.attn)):
        with pytest.raises(ValueError, match="dropout p=0.1"):
            cls.from_dense(module)
    with pytest.raises(ValueError, match="positive int"):
        ColumnParallelLinear(0, 4)
    with pytest.raises(ValueError, match="cannot be combined"):
        ColumnParallelLinear(4, 4, gather_output=True, sequence_parallel=True)
    with pytest.raises(ValueError, match="input_is_parallel=True"):
        RowParallelLinear(4, 4, input_is_parallel=False, sequence_parallel=True)
    with pytest.raises(ValueError, match="n_head=3"):
        ParallelSelfAttention(16, 3)
    with pytest.raises(ValueError, match="expected in_features=4"):
        ColumnParallelLinear(4, 4)(torch.zeros(2, 5))
    with pytest.raises(RuntimeError, match="not initialised"):
        ColumnParallelLinear(4, 4, group=object())
