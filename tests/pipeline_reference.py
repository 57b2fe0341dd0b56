"""The single-process reference the pipeline tests compare real ranks with (one copy)."""

from __future__ import annotations

from torch import nn


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
