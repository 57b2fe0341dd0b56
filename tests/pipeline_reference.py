"""The single-process reference the pipeline tests compare real ranks with (one copy)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from toolkit import comm
from toolkit.pipeline import run_pipeline


def reference(layers, x, y):
    """Loss and gradients of the unsplit model on the full batch (mean squared error). Layers
    that keep state across a sequence's slices (TeraPipe's attention) start a fresh sequence."""
    for layer in layers:
        if hasattr(layer, "start_sequence"):
            layer.start_sequence()
    model = nn.Sequential(*layers)
    model.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    grads = {n: prm.grad.clone() for n, prm in model.named_parameters() if prm.requires_grad}
    model.zero_grad()
    return loss.item(), grads


def run_matches_reference(layers, x, y, *, rtol: float = 1e-5, **pipeline):
    """`run_pipeline(layers, x, y, **pipeline)` under the recorder, checked against
    `reference`: the same gradients, in the same order, and the same loss. Returns (run, trace)
    for the checks a test adds."""
    loss, want = reference(layers, x, y)
    with comm.recording() as trace:
        run = run_pipeline(layers, x, y, **pipeline)
    assert list(run.grads) == list(want)
    for key, g in want.items():
        torch.testing.assert_close(run.grads[key], g, rtol=rtol, atol=1e-6, msg=key)
    assert run.loss == pytest.approx(loss, rel=1e-5)
    return run, trace
