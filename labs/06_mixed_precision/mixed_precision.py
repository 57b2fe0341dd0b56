"""Lab 06: a mixed-precision data-parallel training step.

Micikevicius et al., 2018, "Mixed Precision Training" (ICLR; arXiv:1710.03740): forward and
backward run with 16-bit working weights, the optimizer updates an fp32 *master* copy (§3.1),
and the loss is multiplied by a scale s before backward so small gradients survive in 16 bits,
then divided by s in fp32 before the update (§3.2). The dynamic rule for s is
`torch.amp.GradScaler`'s ("Gradient Scaling" in its documentation):

    an inf/NaN gradient on ANY rank:  skip the step;  s ← s · backoff;  good ← 0
    otherwise:                        step;  good ← good + 1;  if good = N: s ← s·growth, good ← 0

Data parallel (lesson 04): the ranks average their gradients with one all-reduce per step. In
bf16 that all-reduce passes 2 bytes per parameter instead of fp32's 4: half the bytes.

One step, every rank (`train_step`): forward, and backward of the loss times s (16-bit
gradients, s times too large); one flat bf16 all-reduce of the mean gradient; unscaling into
the fp32 masters' gradients, with the inf/NaN flag combined over the ranks; then either an
optimizer step on the masters followed by their rounding into the working weights, or, where
some rank found an inf/NaN, no step on any rank; finally the scale's update.

Use ``dist.all_reduce`` only (`toolkit.precision`, the course's own answer, is off limits).
Create every tensor on the device of the data it belongs to (``device=p.device``, ``*_like``).
Run `autograder grade .` in this folder to check your work (README.md explains each
check); `playground.ipynb` trains a small model with your step on real ranks.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch
import torch.distributed as dist
from torch import Tensor, nn

# ---------------------------------------------------------------------------------------------
# 1. Master weights
# ---------------------------------------------------------------------------------------------


def master_copy(params: Iterable[Tensor]) -> list[Tensor]:
    """An fp32 copy of each (16-bit) working parameter, on its device: new leaf tensors that
    require grad (an optimizer steps them) and share no memory with the working parameters."""
    ### BEGIN SOLUTION
    return [nn.Parameter(p.detach().to(torch.float32, copy=True)) for p in params]
    ### END SOLUTION
    ### HINT: detach, cast to float32 as a copy, and make it a leaf that requires grad.


@torch.no_grad()
def copy_to_working(masters: Iterable[Tensor], params: Iterable[Tensor]) -> None:
    """Round every master into its working parameter, in place: the working tensors keep their
    identity, storage and 16-bit dtype."""
    ### BEGIN SOLUTION
    for m, p in zip(masters, params):
        p.copy_(m)  # copy_ casts to p's dtype, rounding to nearest even
    ### END SOLUTION
    ### HINT: an in-place copy casts to the destination's dtype.


# ---------------------------------------------------------------------------------------------
# 2. The dynamic loss scaler
# ---------------------------------------------------------------------------------------------


class LossScaler:
    """The loss scale s and its dynamic rule (module docstring). ``scale`` (float) is s,
    ``good_steps`` (int) the steps in a row without inf/NaN since the last change of s."""

    def __init__(self, init_scale: float = 2.0 ** 16, *, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000) -> None:
        self.scale = float(init_scale)
        self.growth_factor, self.backoff_factor = float(growth_factor), float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.good_steps = 0

    def scale_loss(self, loss: Tensor) -> Tensor:
        """loss · s (its backward makes every gradient s times larger)."""
        ### BEGIN SOLUTION
        return loss * self.scale
        ### END SOLUTION
        ### HINT: one multiplication.

    @torch.no_grad()
    def unscale_(self, params: list[Tensor], masters: list[Tensor]) -> bool:
        """Set each master's ``.grad`` to its working parameter's gradient divided by s, in fp32
        (a parameter without gradient: master.grad = None). Returns True when ANY rank's
        gradients hold an inf or NaN, the same answer on every rank."""
        ### BEGIN SOLUTION
        inv = 1.0 / self.scale
        found = None
        for p, m in zip(params, masters):
            if p.grad is None:
                m.grad = None
                continue
            # Cast first, then divide: divided in 16 bits, small gradients would underflow again.
            m.grad = p.grad.to(torch.float32, copy=True).mul_(inv)
            bad = (~torch.isfinite(m.grad)).any().to(torch.float32).reshape(1)
            found = bad if found is None else torch.maximum(found, bad)
        if found is None:
            found = torch.zeros(1, dtype=torch.float32,
                                device=masters[0].device if masters else None)
        # Every rank must decide alike: a rank that skips while another steps splits the replicas.
        dist.all_reduce(found, op=dist.ReduceOp.MAX)
        return bool(found.item() > 0)
        ### END SOLUTION
        ### HINT: cast to float32 BEFORE dividing; then one flag per rank, combined over all ranks.

    def update(self, found_inf: bool) -> None:
        """The dynamic rule after one step: back off after an inf/NaN, grow after
        `growth_interval` good steps in a row."""
        ### BEGIN SOLUTION
        if found_inf:
            self.scale, self.good_steps = self.scale * self.backoff_factor, 0
            return
        self.good_steps += 1
        if self.good_steps == self.growth_interval:
            self.scale, self.good_steps = self.scale * self.growth_factor, 0
        ### END SOLUTION
        ### HINT: two counters change: the scale, and the good steps in a row.

    def state_dict(self) -> dict[str, Any]:
        """Everything a resume needs, as plain numbers: ``scale``, ``good_steps``,
        ``growth_factor``, ``backoff_factor``, ``growth_interval``."""
        ### BEGIN SOLUTION
        return {"scale": self.scale, "good_steps": self.good_steps,
                "growth_factor": self.growth_factor, "backoff_factor": self.backoff_factor,
                "growth_interval": self.growth_interval}
        ### END SOLUTION
        ### HINT: a new dict of plain numbers (later updates must not change it).

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""
        ### BEGIN SOLUTION
        self.scale, self.good_steps = float(state["scale"]), int(state["good_steps"])
        self.growth_factor = float(state["growth_factor"])
        self.backoff_factor = float(state["backoff_factor"])
        self.growth_interval = int(state["growth_interval"])
        ### END SOLUTION
        ### HINT: every key state_dict wrote.


# ---------------------------------------------------------------------------------------------
# 3. The data-parallel step
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def all_reduce_gradients(params: Iterable[Tensor]) -> None:
    """Replace each parameter's ``.grad`` by its mean over the ranks, with ONE all-reduce of a
    flat bfloat16 buffer (2 bytes per element on the wire). Parameters without a gradient are
    left out. The gradients keep their own dtype."""
    ### BEGIN SOLUTION
    params = [p for p in params if p.grad is not None]
    if not params:
        return
    flat = torch.cat([p.grad.reshape(-1).to(torch.bfloat16) for p in params])
    flat.div_(dist.get_world_size())  # the mean, divided before the sum (as torch's DDP does)
    dist.all_reduce(flat)
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
        offset += p.numel()
    ### END SOLUTION
    ### HINT: concatenate the gradients as bf16, divide by the world size, all-reduce, copy back.


def train_step(model: nn.Module, masters: list[Tensor], optimizer: torch.optim.Optimizer,
               scaler: LossScaler, loss_fn: Callable[[nn.Module], Tensor]) -> bool:
    """One mixed-precision data-parallel step on this rank (module docstring). `masters` are
    `master_copy(model.parameters())`, `optimizer` steps them (a torch optimizer, or anything
    with ``step()`` and ``zero_grad(set_to_none=True)``); `loss_fn(model)` is this rank's
    loss on its share of the batch. Returns True when the step was taken, False when skipped."""
    ### BEGIN SOLUTION
    working = list(model.parameters())
    model.zero_grad(set_to_none=True)
    scaler.scale_loss(loss_fn(model)).backward()
    all_reduce_gradients(working)
    found = scaler.unscale_(working, masters)
    if not found:
        optimizer.step()
        copy_to_working(masters, working)
    optimizer.zero_grad(set_to_none=True)  # a skipped step's master gradients are dropped too
    scaler.update(found)
    return not found
    ### END SOLUTION
    ### HINT: scaled backward, all-reduce, unscale, step (or skip), copy back, update the scale.
