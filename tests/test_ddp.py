"""toolkit.data_parallel.ddp: every rank ends where a single process on the full batch ends.

The reference trains a copy of the model on the whole batch in one process. Each rank trains
its slice of the batch inside a DDP wrapper; after k optimizer steps every rank's parameters
must equal the reference's. Batches are cut unevenly (10 items on 4 ranks: 3, 3, 2, 2), so each
rank weighs its summed loss by p/N: the average over ranks of those losses is the mean over all
N items, which is what the reference minimises. Each launch checks the three classes at once.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from toolkit import comm
from toolkit.data_parallel.accumulation import accumulate_gradients, split_batch
from toolkit.data_parallel.buckets import assign_buckets
from toolkit.data_parallel.ddp import BucketedDDP, NaiveDDP, OverlappedDDP
from toolkit.launch import spawn
from toolkit.models import GPTConfig, TinyGPT, TinyMLP, make_regression_data, make_token_data

pytestmark = pytest.mark.multirank
TIMEOUT = 90
CLASSES = {"naive": NaiveDDP, "bucketed": BucketedDDP, "overlapped": OverlappedDDP}
STEPS, LR = 3, 0.05
GPT = GPTConfig(vocab_size=16, seq_len=8, d_model=16, n_head=2, n_layer=2, d_ff=24)
TOL = dict(rtol=1e-5, atol=1e-6)


def _model(kind: str) -> nn.Module:
    # Odd widths: no parameter divides evenly into anything.
    return TinyMLP(d_in=5, d_hidden=13, d_out=3, depth=2, seed=1) if kind == "mlp" else TinyGPT(GPT)


def _data(kind: str, n: int = 10):
    if kind == "mlp":
        return make_regression_data(n, 5, 3, seed=2)
    return make_token_data(n, GPT.seq_len, GPT.vocab_size, seed=2)


def _summed_loss(model: nn.Module, kind: str, x, y) -> torch.Tensor:
    """Sum over items (and outputs/tokens) of the per-element loss, divided by elements per item."""
    if kind == "mlp":
        return F.mse_loss(model(x), y, reduction="sum") / y.shape[1]
    logits, _ = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                           reduction="sum") / y.shape[1]


def _reference(kind: str) -> list[torch.Tensor]:
    model, (x, y) = _model(kind), _data(kind)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    for _ in range(STEPS):
        opt.zero_grad()
        (_summed_loss(model, kind, x, y) / len(x)).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _train(rank: int, world_size: int, kind: str) -> dict:
    x, y = _data(kind)
    mine = slice(*[sum(len(c) for c in x.tensor_split(world_size)[:r]) for r in (rank, rank + 1)])
    out = {}
    for name, cls in CLASSES.items():
        model = _model(kind)
        if rank != 0:  # the wrapper must broadcast rank 0's parameters
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(1.0)
        # Caps of ~200 B / ~2 KB: several buckets, some holding several parameters.
        cap = 0.0002 if kind == "mlp" else 0.002
        ddp = cls(model) if name == "naive" else cls(model, bucket_cap_mb=cap)
        opt = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=0.9)
        counts = []
        for _ in range(STEPS):
            opt.zero_grad()
            with comm.recording() as trace:
                # This rank's share of the global mean: sum over its items * p / N.
                loss = _summed_loss(ddp, kind, x[mine], y[mine]) * world_size / len(x)
                loss.backward()
            counts.append([e.nbytes for e in trace.where(op="all_reduce")])
            opt.step()
        expected = ddp.sync_params if name == "naive" else [b.buffer for b in ddp.buckets]
        out[name] = {"params": [p.detach().clone() for p in model.parameters()],
                     "counts": counts, "expected": [t.numel() * 4 for t in expected]}
        if kind == "gpt":
            out[name]["still_tied"] = model.lm_head.weight is model.tok_emb.weight
    return out


@pytest.mark.parametrize("kind, world_size", [("mlp", 2), ("mlp", 3), ("mlp", 4), ("gpt", 2),
                                              ("gpt", 4)])
def test_ranks_match_single_process_on_full_batch(kind, world_size):
    ref = _reference(kind)
    results = spawn(_train, world_size, kind, timeout=TIMEOUT, echo=False)
    for rank, by_class in enumerate(results):
        for name, got in by_class.items():
            assert len(got["params"]) == len(ref)
            for i, (a, b) in enumerate(zip(got["params"], ref)):
                torch.testing.assert_close(a, b, **TOL, msg=f"{name} rank {rank} param {i}")
            # One all-reduce per bucket (naive: per parameter) per step, of the bucket's bytes.
            assert got["counts"] == [got["expected"]] * STEPS, name
            if kind == "gpt":
                assert got["still_tied"], name
    n_buckets = len(results[0]["bucketed"]["expected"])
    assert 1 < n_buckets < len(results[0]["naive"]["expected"])


def _frozen_and_unused(rank: int, world_size: int, name: str) -> dict:
    class Branchy(nn.Module):
        # `extra` is used only when asked; `frozen` is used but never trained.
        def __init__(self) -> None:
            super().__init__()
            self.body = TinyMLP(d_in=4, d_hidden=6, d_out=4, depth=1, seed=3)
            self.extra = nn.Linear(4, 4)
            self.frozen = nn.Linear(4, 4)
            self.frozen.requires_grad_(False)

        def forward(self, x, use_extra: bool):
            h = self.frozen(self.body(x))
            return self.extra(h) if use_extra else h

    torch.manual_seed(0)
    model = Branchy()  # rank 0's initial values win through the broadcast
    frozen_before = model.frozen.weight.detach().clone()
    ddp = CLASSES[name](model) if name == "naive" else CLASSES[name](model, bucket_cap_mb=1e-4)
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(rank))
    # A first backward where every rank uses `extra` fills every bucket slot; the second must
    # not reuse those stale values where a rank has no gradient.
    ddp(x, use_extra=True).pow(2).mean().backward()
    model.zero_grad(set_to_none=True)
    with comm.recording() as trace:
        ddp(x, use_extra=(rank == 0)).pow(2).mean().backward()  # rank 0 alone uses `extra`
    return {"grads": {n: p.grad for n, p in model.named_parameters()},
            "state": {n: p.detach().clone() for n, p in model.named_parameters()},
            "x": x, "frozen_same": torch.equal(frozen_before, model.frozen.weight),
            "reduced": sum(e.nbytes for e in trace.where(op="all_reduce"))}


@pytest.mark.parametrize("name", list(CLASSES))
def test_frozen_are_never_reduced_and_unused_do_not_hang(name):
    results = spawn(_frozen_and_unused, 2, name, timeout=TIMEOUT, echo=False)
    # Reference: the mean over ranks of each rank's own gradient, from rank 0's initial state.
    grads = []
    for rank, res in enumerate(results):
        model = _Replay(results[0]["state"])
        model(res["x"], use_extra=(rank == 0)).pow(2).mean().backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for res in results:
        assert res["grads"]["frozen.weight"] is None and res["grads"]["frozen.bias"] is None
        assert res["frozen_same"]
        for n in (n for n in res["grads"] if "frozen" not in n):
            want = sum(g[n] if g[n] is not None else 0 for g in grads) / 2
            torch.testing.assert_close(res["grads"][n], want, **TOL)
        trainable = sum(v.numel() * 4 for n, v in res["state"].items() if "frozen" not in n)
        assert res["reduced"] == trainable  # every trainable byte once, no frozen byte


class _Replay(nn.Module):
    """The Branchy model of `_frozen_and_unused`, loaded from a state (for the reference)."""

    def __init__(self, state: dict) -> None:
        super().__init__()
        self.body = TinyMLP(d_in=4, d_hidden=6, d_out=4, depth=1)
        self.extra, self.frozen = nn.Linear(4, 4), nn.Linear(4, 4)
        self.frozen.requires_grad_(False)
        with torch.no_grad():
            for n, p in self.named_parameters():
                p.copy_(state[n])

    def forward(self, x, use_extra: bool):
        h = self.frozen(self.body(x))
        return self.extra(h) if use_extra else h


def _overlap(rank: int, world_size: int, name: str) -> dict:
    model = TinyMLP(d_in=64, d_hidden=128, d_out=64, depth=4, seed=0)
    first = model.layers[0].weight  # its gradient is the last one backward computes
    ready = []
    # Registered before the wrapper's hook, so it fires before DDP sees that gradient.
    first.register_post_accumulate_grad_hook(lambda p: ready.append(time.time()))
    ddp = CLASSES[name](model, bucket_cap_mb=0.05)
    x, y = make_regression_data(32, 64, 64, seed=rank)
    with comm.recording() as trace:
        F.mse_loss(ddp(x), y).backward()
        backward_returned = time.time()
    starts = [e.start for e in trace.where(op="all_reduce")]
    return {"starts": starts, "first_ready": ready[0], "returned": backward_returned,
            "ends": [e.end for e in trace.where(op="all_reduce")], "buckets": len(ddp.buckets)}


@pytest.mark.parametrize("world_size", [2, 4])
def test_overlapped_starts_all_reduce_during_backward(world_size):
    for name in ("overlapped", "bucketed"):
        for res in spawn(_overlap, world_size, name, timeout=TIMEOUT, echo=False):
            assert res["buckets"] >= 3 and len(res["starts"]) == res["buckets"]
            early = [s for s in res["starts"] if s < res["first_ready"]]
            if name == "overlapped":
                # Launched while layer 0's gradient was still being computed.
                assert len(early) >= 1, res
            else:
                assert early == [], res  # the bucketed one waits for the whole backward
            # Both have waited for every all-reduce before backward() returned.
            assert all(e is not None and e <= res["returned"] for e in res["ends"])


def _accumulate(rank: int, world_size: int, k: int) -> dict:
    x, y = make_regression_data(24, 5, 3, seed=4)
    x, y = x.tensor_split(world_size)[rank], y.tensor_split(world_size)[rank]
    model = TinyMLP(d_in=5, d_hidden=13, d_out=3, seed=5)
    ddp = OverlappedDDP(model, bucket_cap_mb=0.0005)  # ~500 B: 3 buckets
    with comm.recording() as trace:
        accumulate_gradients(ddp, split_batch(x, y, micro_batches=k),
                             lambda m, a, b: F.mse_loss(m(a), b))
    return {"grads": [p.grad for p in model.parameters()], "buckets": len(ddp.buckets),
            "calls": len(trace.where(op="all_reduce"))}


def test_no_sync_accumulation_reduces_once_and_equals_full_batch():
    x, y = make_regression_data(24, 5, 3, seed=4)
    ref = TinyMLP(d_in=5, d_hidden=13, d_out=3, seed=5)
    F.mse_loss(ref(x), y).backward()
    for res in spawn(_accumulate, 2, 3, timeout=TIMEOUT, echo=False):
        assert res["calls"] == res["buckets"] > 1  # once per step, not once per micro-batch
        for got, want in zip(res["grads"], ref.parameters()):
            torch.testing.assert_close(got, want.grad, **TOL)


def test_assign_buckets_reverse_order_cap_and_dtype():
    ps = [torch.zeros(10), torch.zeros(10), torch.zeros(30), torch.zeros(5, dtype=torch.float64),
          torch.zeros(5)]
    # 40, 40, 120, 40 (f64), 20 bytes; cap 100: reverse order, a dtype change closes a bucket,
    # and a bucket closes once it holds >= cap bytes (PyTorch's rule)
    assert assign_buckets(ps, 100) == [[4], [3], [2], [1, 0]]
    assert assign_buckets(ps[:2], 80) == [[1, 0]]
    assert assign_buckets(ps[:2], 79) == [[1, 0]]
    assert assign_buckets(ps[:2], 40) == [[1], [0]]
    assert assign_buckets(ps[:3], 50) == [[2], [1, 0]]
    with pytest.raises(ValueError, match="cap_bytes"):
        assign_buckets(ps, 0)


def test_wrapper_needs_a_process_group():
    with pytest.raises(RuntimeError, match="process group"):
        OverlappedDDP(TinyMLP())
