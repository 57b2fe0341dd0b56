"""Lab 03's reference: what single-process training gives, in float64, for a case.

The grader trains the case's seeded model in one process on the whole batch (every rank had an
equal slice, so the sharded run must apply the *mean* gradient) and compares: the parameters a
sharded run ends with (`reference`), and each rank's local gradients, which its reduce-scatters
must carry, ZeRO's and FSDP's (`zero_contents`). Loaded by path from checks.py and traffic.py,
as the grader loads every lab file; the harness is the lab's harness.py under the name the
ranks use.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from _lab_harness import OPTIMIZERS, local_batch, make_data, make_model  # the lab's harness.py
from autograder.feedback import in_blocks
from autograder.lab import CaseResult


def label(r: CaseResult) -> str:
    """How feedback names a case: its ranks, layer sizes and frozen parameters."""
    frozen = f", frozen {', '.join(r.case['frozen'])}" if r.case.get("frozen") else ""
    return f"{r.world_size} ranks, layers {r.case['dims']}{frozen}"


def training(case: dict, *, steps: int, optimizer: str, grad_scale: float = 1.0):
    """The seeded model trained in one process, float64, on the whole batch: yields the model
    before each step and once more after the last. `grad_scale` = world_size gives what a run
    that *sums* gradients over ranks would reach."""
    model = make_model(case).double()
    x, y = (t.double() for t in make_data(case))
    _, cls, options = OPTIMIZERS[optimizer]
    opt = cls([p for p in model.parameters() if p.requires_grad], **options)
    for _ in range(steps):
        yield model
        opt.zero_grad()
        (grad_scale * F.mse_loss(model(x), y)).backward()
        opt.step()
    yield model


def reference(case: dict, *, steps: int, optimizer: str, grad_scale: float = 1.0) -> nn.Module:
    """The model after `steps` steps of `training`."""
    *_, model = training(case, steps=steps, optimizer=optimizer, grad_scale=grad_scale)
    return model


def padded(tensors: list[torch.Tensor], p: int) -> torch.Tensor:
    flat = torch.cat([t.detach().reshape(-1) for t in tensors])
    return torch.cat([flat, flat.new_zeros(p * math.ceil(flat.numel() / p) - flat.numel())])


def zero_contents(case: dict, p: int) -> list[tuple[list[list[torch.Tensor]], list[torch.Tensor]]]:
    """Per step of single-process training (float64), per trainable parameter in model order:
    each rank's local gradient (of the mean loss over its slice of the batch: what its
    reduce-scatter carries, flattened and padded) and the parameter after the step (what the
    all-gathers carry, shard by shard)."""
    steps, optimizer = case.get("steps", 3), case.get("optimizer", "sgd")
    out, grads = [], None
    for model in training(case, steps=steps, optimizer=optimizer):
        params = [q for q in model.parameters() if q.requires_grad]
        if grads is not None:
            out.append((grads, [q.detach().reshape(-1).clone() for q in params]))
        grads = []
        for rank in range(p):
            x, y = (t.double() for t in local_batch(case, rank, p))
            grads.append([g.reshape(-1) for g in
                          torch.autograd.grad(F.mse_loss(model(x), y), params)])
    return out


def block_order(gathered: torch.Tensor | None, blocks: list[torch.Tensor]) -> list[int] | None:
    """The order in which a rank flattened the trainable parameters, read from what the ranks'
    first all-gathers carried put together (`gathered`, p·S, padding last): the parameter whose
    updated values come next, block by block. Model order is what `flatten_padded` of
    ``model.parameters()`` gives; any other order is as correct. None: no order explains it."""
    order = None if gathered is None else in_blocks(gathered, blocks, close)
    return order if order is not None and len(order) == len(blocks) else None


RTOL, ATOL = 1e-4, 2e-5
"""`close`'s tolerance: a correct float32 run's values, gradients and shards against the float64
reference (tests/test_lab03_judges.py: a float32 FSDP's reduce-scatters stay under half of it)."""


def close(got, want: torch.Tensor) -> bool:
    return (isinstance(got, torch.Tensor) and got.shape == want.shape
            and torch.allclose(got.double(), want, rtol=RTOL, atol=ATOL))


def mismatch(states: list, want: dict[str, torch.Tensor]) -> tuple[int, str] | None:
    """(rank, parameter name) of the first parameter that differs, or None."""
    for rank, state in enumerate(states):
        for name, value in want.items():
            if not isinstance(state, dict) or not close(state.get(name), value):
                return rank, name
    return None
