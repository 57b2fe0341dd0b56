"""toolkit.data_parallel.large_batch: LARS and LAMB against their algorithm boxes written out
(You et al. 2017, Algorithm 1; You et al. 2020, Algorithm 2), the trust ratio's edge cases,
data-parallel LAMB on 2-4 gloo ranks against one process on the full batch, and the large-
batch run of lesson 15: SGD at the linearly scaled learning rate blows up, LAMB does not.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from toolkit.data_parallel.ddp import OverlappedDDP
from toolkit.data_parallel.large_batch import LAMB, LARS, lamb_trust_ratio, lars_local_lr
from toolkit.experiments.large_batch import Recipe, train
from toolkit.launch import spawn
from toolkit.models import TinyMLP, make_regression_data

TIMEOUT = 90


def _mlp():
    return TinyMLP(d_in=6, d_hidden=10, d_out=3, depth=2, seed=2)


def _grads_of(model, step):
    x, y = make_regression_data(16, 6, 3, seed=10 + step)
    model.zero_grad()
    F.mse_loss(model(x), y).backward()


def test_lamb_matches_algorithm_2():
    b1, b2, eps, lam, lr = 0.9, 0.99, 1e-6, 0.01, 0.05
    model, ref = _mlp(), _mlp()
    params = list(model.parameters())
    # biases without the ratio (adapt=False), as BERT's LAMB leaves them
    opt = LAMB([{"params": [p for p in params if p.dim() > 1]},
                {"params": [p for p in params if p.dim() == 1], "adapt": False}],
               lr=lr, betas=(b1, b2), eps=eps, weight_decay=lam)
    m = [torch.zeros_like(p) for p in ref.parameters()]
    v = [torch.zeros_like(p) for p in ref.parameters()]
    for t in range(1, 6):
        _grads_of(model, t)
        opt.step()
        _grads_of(ref, t)
        with torch.no_grad():
            for i, x in enumerate(ref.parameters()):
                g = x.grad
                m[i] = b1 * m[i] + (1 - b1) * g
                v[i] = b2 * v[i] + (1 - b2) * g * g
                r = (m[i] / (1 - b1**t)) / ((v[i] / (1 - b2**t)).sqrt() + eps)
                u = r + lam * x
                ratio = x.norm() / u.norm() if x.dim() > 1 else 1.0
                x -= lr * ratio * u
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_lars_matches_algorithm_1():
    lr, mu, beta, eta = 2.0, 0.9, 1e-3, 1e-3
    model, ref = _mlp(), _mlp()
    opt = LARS(model.parameters(), lr=lr, momentum=mu, weight_decay=beta, trust_coefficient=eta)
    vel = [torch.zeros_like(p) for p in ref.parameters()]
    for t in range(5):
        _grads_of(model, t)
        opt.step()
        _grads_of(ref, t)
        with torch.no_grad():
            for i, w in enumerate(ref.parameters()):
                local = eta * w.norm() / (w.grad.norm() + beta * w.norm())
                vel[i] = mu * vel[i] + lr * local * (w.grad + beta * w)
                w -= vel[i]
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_trust_ratio_edge_cases():
    w = torch.tensor([3.0, 4.0])
    assert lamb_trust_ratio(w, torch.tensor([0.0, 0.5])).item() == pytest.approx(10.0)
    assert lamb_trust_ratio(torch.zeros(2), w).item() == 1.0      # a zero-initialised bias
    assert lamb_trust_ratio(w, torch.zeros(2)).item() == 1.0      # no update
    assert lars_local_lr(w, torch.zeros(2), trust_coefficient=0.1, weight_decay=0.0).item() == 1.0
    assert lars_local_lr(w, torch.tensor([0.0, 5.0]), trust_coefficient=0.1,
                         weight_decay=1.0).item() == pytest.approx(0.1 * 5 / (5 + 5))
    with pytest.raises(ValueError, match="one shape"):
        lamb_trust_ratio(w, torch.zeros(3))
    with pytest.raises(ValueError, match="betas"):
        LAMB(_mlp().parameters(), betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="lr"):
        LARS(_mlp().parameters(), lr=-1.0)


def _lamb_ddp(rank, world_size, steps):
    x, y = make_regression_data(12, 6, 3, seed=3)
    model = _mlp()
    ddp = OverlappedDDP(model, bucket_cap_mb=0.0002)
    opt = LAMB(ddp.parameters(), lr=0.05, weight_decay=0.01)
    mine = slice(rank * 12 // world_size, (rank + 1) * 12 // world_size)
    for _ in range(steps):
        opt.zero_grad()
        F.mse_loss(ddp(x[mine]), y[mine]).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.multirank
@pytest.mark.parametrize("world_size", [3, 4])
def test_data_parallel_lamb_equals_one_process_on_the_full_batch(world_size):
    steps = 4
    x, y = make_regression_data(12, 6, 3, seed=3)
    ref = _mlp()
    opt = LAMB(ref.parameters(), lr=0.05, weight_decay=0.01)
    for _ in range(steps):
        opt.zero_grad()
        F.mse_loss(ref(x), y).backward()
        opt.step()
    for params in spawn(_lamb_ddp, world_size, steps, timeout=TIMEOUT, echo=False):
        for a, b in zip(params, ref.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.multirank
def test_sgd_at_the_linearly_scaled_lr_blows_up_and_lamb_does_not():
    """Batch 512 = 64 × lesson 04's 8: the linear rule's lr 0.05·64 = 3.2 sends SGD to inf/nan
    (with warm-up too), LAMB trains. Deterministic for the seed; bounds with wide margins."""
    runs = train([Recipe("sgd", "sgd", 3.2), Recipe("sgd+warm-up", "sgd", 3.2, warmup_epochs=2),
                  Recipe("lamb", "lamb", 0.02)], world_size=2, batch=512, epochs=8,
                 timeout=TIMEOUT)
    sgd, warm, lamb = runs
    assert len(lamb.losses) == 8 * 4096 // 512
    assert sgd.blew_up and sgd.diverged and not math.isfinite(sgd.final_loss)
    assert warm.blew_up and not math.isfinite(warm.final_loss)
    assert not lamb.diverged and lamb.final_loss < 0.05 < 0.5 < lamb.initial_loss
    assert all(math.isfinite(v) for v in lamb.losses)
