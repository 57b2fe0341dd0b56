"""toolkit.data_parallel.local_sgd: LocalSGD and DiLoCo on 2-4 gloo ranks against a single
process that runs the same k workers one after another (the algorithm box written out), the
bytes they all-reduce, and the two identities: H = 1 is DDP (momentum SGD), DiLoCo with an
outer SGD of learning rate 1 is local SGD.

The reference workers start from rank 0's model (the wrappers broadcast it: every other rank
builds a different one), train on their own items, and every H steps average (local SGD) or
take the outer Nesterov step on the averaged delta (DiLoCo, Douillard et al. 2023, Alg. 1).
TinyGPT has a tied embedding/head (one tensor) and here a frozen position embedding (not in
the optimizer: never averaged, never changed).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from toolkit import comm
from toolkit.cost.traffic import ddp_bytes, local_sgd_bytes
from toolkit.data_parallel.ddp import BucketedDDP
from toolkit.data_parallel.local_sgd import DiLoCo, LocalSGD
from toolkit.launch import spawn
from toolkit.models import GPTConfig, TinyGPT, TinyMLP, make_regression_data, make_token_data

pytestmark = pytest.mark.multirank
TIMEOUT = 90
GPT = GPTConfig(vocab_size=16, seq_len=6, d_model=12, n_head=2, n_layer=1, d_ff=20)
TOL = dict(rtol=1e-5, atol=1e-6)
BATCH = 3


def _model(kind: str, seed: int = 0) -> torch.nn.Module:
    if kind == "mlp":    # odd widths
        return TinyMLP(d_in=5, d_hidden=11, d_out=3, depth=2, seed=seed)
    model = TinyGPT(GPTConfig(**{**GPT.__dict__, "seed": seed}))
    model.pos_emb.weight.requires_grad_(False)   # frozen: not in the optimizer
    # The key bias shifts every score of a query alike, which softmax ignores: its gradient is
    # 0 up to float noise, and Adam would scale that noise up to full steps. Frozen too.
    for block in model.blocks:
        block.attn.k_proj.bias.requires_grad_(False)
    return model


def _data(kind: str, n: int = 200):
    if kind == "mlp":
        return make_regression_data(n, 5, 3, seed=4)
    return make_token_data(n, GPT.seq_len, GPT.vocab_size, seed=4)


def _loss(kind, model, x, y):
    return F.mse_loss(model(x), y) if kind == "mlp" else model(x, y)[1]


def _items(step: int, rank: int, world_size: int) -> slice:
    start = (step * world_size + rank) * BATCH
    return slice(start, start + BATCH)


def _inner(kind_opt: str, params):
    if kind_opt == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    return torch.optim.AdamW(params, lr=0.01, weight_decay=0.1)


def _reference(kind, world_size, steps, H, method, inner, outer_lr=0.7, mu=0.9):
    """k workers in one process: the algorithm box."""
    x, y = _data(kind)
    workers = [_model(kind, seed=0) for _ in range(world_size)]   # rank 0's start everywhere
    opts = [_inner(inner, [p for p in w.parameters() if p.requires_grad]) for w in workers]
    trained = [[p for p in w.parameters() if p.requires_grad] for w in workers]
    anchor = [p.detach().clone() for p in trained[0]]
    momentum = [torch.zeros_like(a) for a in anchor]
    for step in range(steps):
        for r, (w, opt) in enumerate(zip(workers, opts)):
            opt.zero_grad()
            xb, yb = x[_items(step, r, world_size)], y[_items(step, r, world_size)]
            _loss(kind, w, xb, yb).backward()
            opt.step()
        if (step + 1) % H:
            continue
        with torch.no_grad():
            for j in range(len(anchor)):
                mean = sum(t[j] for t in trained) / world_size
                if method == "local_sgd":
                    new = mean
                else:   # DiLoCo: Δ = θ(t−1) − mean θᵢ; Nesterov: m ← μm + Δ; θ ← θ − lr(Δ + μm)
                    delta = anchor[j] - mean
                    momentum[j] = mu * momentum[j] + delta
                    new = anchor[j] - outer_lr * (delta + mu * momentum[j])
                anchor[j] = new.clone()
                for t in trained:
                    t[j].copy_(new)
    return [[p.detach().clone() for p in t] for t in trained]


def _train(rank, world_size, kind, steps, H, method, inner, outer=None):
    x, y = _data(kind)
    model = _model(kind, seed=rank)          # different on every rank: the broadcast must fix it
    params = [p for p in model.parameters() if p.requires_grad]
    opt = _inner(inner, params)
    if method == "local_sgd":
        wrapper = LocalSGD(opt, sync_every=H, module=model)   # broadcasts the frozen one too
    elif outer == "sgd1":
        wrapper = DiLoCo(opt, sync_every=H, module=model,
                         outer=lambda ps: torch.optim.SGD(ps, lr=1.0))
    else:
        wrapper = DiLoCo(opt, sync_every=H, module=model)
    synced = []
    with comm.recording() as trace:
        for step in range(steps):
            wrapper.zero_grad()
            _loss(kind, model, x[_items(step, rank, world_size)],
                  y[_items(step, rank, world_size)]).backward()
            synced.append(wrapper.step())
    reduces = trace.where(op="all_reduce")
    return {"params": [p.detach().clone() for p in params], "synced": synced,
            "bytes": [e.nbytes for e in reduces], "numel": wrapper.numel,
            "tied": kind != "gpt" or model.lm_head.weight is model.tok_emb.weight,
            "frozen": kind != "gpt" or torch.equal(model.pos_emb.weight,
                                                   _model(kind, seed=0).pos_emb.weight)}


@pytest.mark.parametrize("kind, world_size, method, inner, H, steps", [
    ("mlp", 2, "local_sgd", "sgd", 3, 7),      # 7 steps: the last round is cut short
    ("mlp", 4, "local_sgd", "sgd", 2, 6),
    ("gpt", 3, "local_sgd", "adamw", 3, 6),
    ("mlp", 3, "diloco", "adamw", 2, 6),
    ("gpt", 2, "diloco", "adamw", 3, 7),
])
def test_matches_single_process_workers(kind, world_size, method, inner, H, steps):
    ref = _reference(kind, world_size, steps, H, method, inner)
    results = spawn(_train, world_size, kind, steps, H, method, inner, timeout=TIMEOUT,
                    echo=False)
    for rank, got in enumerate(results):
        for i, (a, b) in enumerate(zip(got["params"], ref[rank])):
            torch.testing.assert_close(a, b, **TOL, msg=f"rank {rank} param {i}")
        assert got["synced"] == [(s + 1) % H == 0 for s in range(steps)]
        # Exactly one all-reduce of Ψ fp32 elements per synchronisation, nothing else.
        assert got["bytes"] == [4 * got["numel"]] * (steps // H)
        assert sum(got["bytes"]) == local_sgd_bytes(got["numel"], steps=steps, sync_every=H)
        assert got["tied"] and got["frozen"]
    n_trainable = sum(p.numel() for p in _model(kind).parameters() if p.requires_grad)
    assert results[0]["numel"] == n_trainable
    if steps % H:   # mid-round: the replicas have drifted apart
        assert any(not torch.equal(a, b) for a, b in zip(results[0]["params"],
                                                          results[1]["params"]))


def _h1_and_ddp(rank, world_size, steps):
    x, y = _data("mlp")
    out = {}
    for name in ("local", "ddp"):
        model = _model("mlp", seed=rank)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        forward, stepper = model, LocalSGD(opt, sync_every=1) if name == "local" else opt
        if name == "ddp":
            forward = BucketedDDP(model, bucket_cap_mb=0.0002)   # several buckets
        with comm.recording() as trace:
            for step in range(steps):
                stepper.zero_grad()
                xb, yb = x[_items(step, rank, world_size)], y[_items(step, rank, world_size)]
                F.mse_loss(forward(xb), yb).backward()
                stepper.step()
        out[name] = ([p.detach().clone() for p in model.parameters()],
                     sum(e.nbytes for e in trace.where(op="all_reduce")))
    return out


def test_h1_momentum_sgd_is_ddp():
    world_size, steps = 3, 5
    results = spawn(_h1_and_ddp, world_size, steps, timeout=TIMEOUT, echo=False)
    numel = sum(p.numel() for p in _model("mlp").parameters())
    for got in results:
        (local, local_bytes), (ddp, ddp_bytes_) = got["local"], got["ddp"]
        for a, b in zip(local, ddp):
            # The same algebra; only the order of float additions differs.
            torch.testing.assert_close(a, b, **TOL)
        assert local_bytes == ddp_bytes_ == ddp_bytes(numel, steps=steps)


def test_diloco_with_outer_sgd_lr_1_is_local_sgd():
    a = spawn(_train, 2, "mlp", 6, 3, "diloco", "sgd", "sgd1", timeout=TIMEOUT, echo=False)
    b = spawn(_train, 2, "mlp", 6, 3, "local_sgd", "sgd", timeout=TIMEOUT, echo=False)
    for x, y in zip(a[0]["params"], b[0]["params"]):
        torch.testing.assert_close(x, y, **TOL)
    assert a[0]["bytes"] == b[0]["bytes"]


def _bad_arguments(rank, world_size):
    model = TinyMLP(seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    errors = []
    for call in (lambda: LocalSGD(opt, sync_every=0), lambda: LocalSGD(model, sync_every=2),
                 lambda: DiLoCo(torch.optim.SGD([torch.nn.Parameter(torch.zeros(2)),
                                                 torch.nn.Parameter(torch.zeros(2,
                                                                    dtype=torch.float64))],
                                                lr=0.1), sync_every=2)):
        try:
            call()
        except (TypeError, ValueError) as err:
            errors.append(f"{type(err).__name__}: {err}")
    return errors


def test_arguments_are_checked():
    errors = spawn(_bad_arguments, 2, timeout=TIMEOUT, echo=False)[0]
    assert len(errors) == 3
    assert "sync_every" in errors[0] and "ValueError" in errors[0]
    assert "torch.optim.Optimizer" in errors[1] and "TypeError" in errors[1]
    assert "one dtype" in errors[2]
    with pytest.raises(RuntimeError, match="process group"):
        LocalSGD(torch.optim.SGD(TinyMLP().parameters(), lr=0.1), sync_every=2)


def test_byte_formulas():
    assert ddp_bytes(1000, steps=3) == 12_000
    assert local_sgd_bytes(1000, steps=10, sync_every=4) == 8_000     # 2 syncs
    assert local_sgd_bytes(1000, steps=10, sync_every=1) == ddp_bytes(1000, steps=10)
    with pytest.raises(ValueError, match="sync_every"):
        local_sgd_bytes(10, steps=3, sync_every=0)
