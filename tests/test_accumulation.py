"""toolkit.data_parallel.accumulation: k micro-batches give the gradient of one big batch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from toolkit.data_parallel.accumulation import accumulate_gradients, split_batch
from toolkit.models import GPTConfig, TinyGPT, TinyMLP, make_regression_data, make_token_data


def _mse(model, x, y):
    return F.mse_loss(model(x), y)


def _grads(model):
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("k", [1, 2, 3, 7])
def test_accumulated_gradient_equals_full_batch(k):
    x, y = make_regression_data(14, 8, 4, seed=1)  # 14 items: k=3 gives 5, 5, 4 (uneven)
    full, acc = TinyMLP(seed=2), TinyMLP(seed=2)
    _mse(full, x, y).backward()
    loss = accumulate_gradients(acc, split_batch(x, y, micro_batches=k), _mse)
    for a, b in zip(_grads(acc), _grads(full)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loss, _mse(full, x, y).detach())


def test_without_the_scaling_the_gradient_is_k_times_too_big():
    x, y = make_regression_data(12, 8, 4, seed=1)
    full, acc = TinyMLP(seed=2), TinyMLP(seed=2)
    _mse(full, x, y).backward()
    for xb, yb in split_batch(x, y, micro_batches=4):
        _mse(acc, xb, yb).backward()  # the classic bug: no 1/k
    for a, b in zip(_grads(acc), _grads(full)):
        torch.testing.assert_close(a, 4 * b, rtol=1e-5, atol=1e-6)


def test_tied_gpt_and_training_steps_match():
    cfg = GPTConfig(vocab_size=16, seq_len=8, d_model=16, n_head=2, n_layer=1)
    x, y = make_token_data(8, 8, 16, seed=3)
    full, acc = TinyGPT(cfg), TinyGPT(cfg)
    # SGD, not Adam: Adam divides by sqrt(v), which blows float noise on ~0 gradients up.
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (full, acc)]
    for _ in range(3):
        for o in opts:
            o.zero_grad()
        full(x, y)[1].backward()
        accumulate_gradients(acc, split_batch(x, y, micro_batches=4), lambda m, a, b: m(a, b)[1])
        for o in opts:
            o.step()
    for a, b in zip(full.parameters(), acc.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_no_sync_wraps_every_micro_batch_but_the_last():
    entered = []

    class Fake(TinyMLP):
        def no_sync(self):
            import contextlib
            entered.append(True)
            return contextlib.nullcontext()

    x, y = make_regression_data(6, 8, 4)
    accumulate_gradients(Fake(), split_batch(x, y, micro_batches=3), _mse)
    assert len(entered) == 2
    entered.clear()
    accumulate_gradients(Fake(), split_batch(x, y, micro_batches=3), _mse, sync_last_only=False)
    assert entered == []


def test_split_batch_checks_its_arguments():
    x = torch.zeros(5, 2)
    assert [len(a) for (a,) in split_batch(x, micro_batches=2)] == [3, 2]
    with pytest.raises(ValueError, match="micro_batches"):
        split_batch(x, micro_batches=0)
    with pytest.raises(ValueError, match="more than"):
        split_batch(x, micro_batches=6)
    with pytest.raises(ValueError, match="first dimension"):
        split_batch(x, torch.zeros(4), micro_batches=2)
    with pytest.raises(ValueError, match="empty"):
        accumulate_gradients(TinyMLP(), [], _mse)
