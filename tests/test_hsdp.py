"""toolkit.data_parallel.hsdp: hybrid sharding (shard within a group, replicate across groups)
equals single-process training on a 2 × 2 layout, holds 1/S of the model per rank, and keeps
the all-gathers inside shard groups while only gradient shards are all-reduced across them."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from toolkit import comm
from toolkit import memory as M
from toolkit.data_parallel.hsdp import HybridLayout, HybridShardedDataParallel as HSDP
from toolkit.launch import spawn
from toolkit.models import GPTConfig, TinyGPT, TinyMLP, make_regression_data, make_token_data

pytestmark = pytest.mark.multirank
TIMEOUT = 90
STEPS = 3
BATCH = 8
CFG = GPTConfig(vocab_size=37, seq_len=8, d_model=20, n_head=2, n_layer=2)
MLP = dict(d_in=7, d_hidden=10, d_out=3, depth=2)  # 7·10+10 = 80 … sizes not divisible by 4


def _model(kind):
    if kind == "mlp":
        return TinyMLP(**MLP)
    model = TinyGPT(CFG)  # tied embedding/head in the root unit
    model.blocks[1].ln_1.weight.requires_grad_(False)  # a frozen group inside a unit
    return model


def _loss(kind, model, rank, world, lo_frac=0.0, hi_frac=1.0):
    n = BATCH // world
    lo, hi = rank * n + int(lo_frac * n), rank * n + int(hi_frac * n)
    if kind == "mlp":
        x, y = make_regression_data(BATCH, MLP["d_in"], MLP["d_out"])
        return F.mse_loss(model(x[lo:hi]), y[lo:hi])
    x, y = make_token_data(BATCH, CFG.seq_len, CFG.vocab_size)
    return model(x[lo:hi], y[lo:hi])[1]


def _reference(kind):
    model = _model(kind)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(STEPS):
        opt.zero_grad()
        _loss(kind, model, 0, 1).backward()
        opt.step()
    return model.state_dict()


def _hsdp(rank, world, kind, shard_size, prefetch, accumulate):
    layout = HybridLayout(world, shard_size)
    model = HSDP(_model(kind), layout, prefetch=prefetch)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    with comm.recording() as trace:
        for _ in range(STEPS):
            opt.zero_grad()
            if accumulate:  # two half batches, one step: same gradient as the whole
                for lo, hi in ((0.0, 0.5), (0.5, 1.0)):
                    (_loss(kind, model, rank, world, lo, hi) / 2).backward()
            else:
                _loss(kind, model, rank, world).backward()
            opt.step()
    held = M.held_model_states(model, opt)
    groups = [(g.numel, g.trainable) for g in model._all_groups()]
    events = [(e.op, e.nbytes, e.group) for e in trace.events]
    return model.full_state_dict(), held, groups, events


@pytest.mark.parametrize("kind,prefetch,accumulate", [("mlp", False, False),
                                                      ("gpt", True, False),
                                                      ("mlp", False, True)])
def test_2x2_matches_single_process(kind, prefetch, accumulate):
    want = _reference(kind)
    for state, held, groups, _events in spawn(_hsdp, 4, kind, 2, prefetch, accumulate,
                                             timeout=TIMEOUT, echo=False):
        assert state.keys() == want.keys()
        for name in want:
            torch.testing.assert_close(state[name], want[name], rtol=1e-4, atol=3e-5,
                                       msg=lambda m, name=name: f"{kind} {name}: {m}")
        # Sharded over S = 2, not W = 4: each flat group's padded half, fp32 Adam.
        assert held.params == sum(4 * M.shard_numel(n, 2) for n, _ in groups)
        assert held.grads + held.optimizer == sum(12 * M.shard_numel(n, 2)
                                                  for n, t in groups if t)


def test_traffic_stays_in_its_groups():
    (_, _, groups, events), *_ = spawn(_hsdp, 4, "mlp", 2, False, False, timeout=TIMEOUT,
                                       echo=False)
    shard_group, replicate_group = (0, 1), (0, 2)  # rank 0's
    calls = Counter((op, grp) for op, _, grp in events)
    units = len(groups)  # TinyMLP: every Linear a unit, all trainable
    assert calls == {("all_gather_into_tensor", shard_group): 2 * units * STEPS,
                     ("reduce_scatter_tensor", shard_group): units * STEPS,
                     ("all_reduce", replicate_group): units * STEPS}
    # What crosses replicas is one gradient shard per unit: Ψ/S elements, not Ψ.
    reduced = sum(n for op, n, _ in events if op == "all_reduce") // STEPS
    assert reduced == 4 * sum(M.shard_numel(n, 2) for n, _ in groups)


def test_one_replica_is_fsdp_and_layout_errors():
    want = _reference("mlp")
    for state, *_ , events in spawn(_hsdp, 2, "mlp", 2, False, False, timeout=TIMEOUT,
                                    echo=False):
        assert not any(op == "all_reduce" for op, *_ in events)  # R = 1: nothing to replicate
        for name in want:
            torch.testing.assert_close(state[name], want[name], rtol=1e-4, atol=3e-5)
    layout = HybridLayout(8, 4)
    assert layout.replicas == 2
    assert layout.shard_group_ranks() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert layout.replicate_group_ranks() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    with pytest.raises(ValueError, match="shard_size must divide"):
        HybridLayout(6, 4)
    with pytest.raises(RuntimeError, match="not initialised"):
        HSDP(TinyMLP(), layout)
