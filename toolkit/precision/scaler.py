"""Loss scaling: keep small fp16 gradients from flushing to zero, and skip the steps that overflow.

Micikevicius et al., "Mixed Precision Training", ICLR 2018, §3.2: multiply the loss by s before
backward, so every gradient is s times larger while it lives in 16 bits (the chain rule is
linear in the loss), then divide the gradients by s in fp32 before the update; if a scaled
gradient overflowed (inf or NaN), skip the update. The *dynamic* rule that picks s is the one
`torch.amp.GradScaler` implements (its documentation, "Gradient Scaling"):

    overflow anywhere:   skip the step;  s ← s · backoff (0.5);  good ← 0
    otherwise:           step;           good ← good + 1;  if good = N: s ← s · growth (2), good ← 0

with N = ``growth_interval`` (2000 in torch). A static scale is the same with growth = backoff
= 1. Data parallel: each rank sees only its own gradients (with ZeRO or FSDP only its shard,
where an overflow in one element lands on one rank), so the inf/NaN flag is all-reduced (MAX)
over the ranks before deciding: every rank skips the same steps and the replicas stay equal
(torch's ShardedGradScaler does the same for FSDP).

    scaler = DynamicLossScaler(2.0 ** 16)
    scaler.scale(loss).backward()
    scaler.step(optimizer)        # unscale (once), inf/NaN check on all ranks, step or skip
    scaler.update()               # backoff or growth

Gradients stored in 16 bits are unscaled into fp32 by the optimizer (`MasterWeightOptimizer
.unscale_`): dividing them in place in 16 bits would underflow them again. fp32 gradients (an
fp32 model under `torch.autocast`) are unscaled in place, as torch does.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from ..arguments import check_int, check_positive


def next_scale(scale: float, good_steps: int, found_inf: bool, *, growth_factor: float = 2.0,
               backoff_factor: float = 0.5, growth_interval: int = 2000) -> tuple[float, int]:
    """One update of the dynamic rule (module docstring): ``(scale, good_steps)`` after a step
    that found an inf/NaN (`found_inf`) or did not."""
    if found_inf:
        return scale * backoff_factor, 0
    good_steps += 1
    if good_steps == growth_interval:
        return scale * growth_factor, 0
    return scale, good_steps


class DynamicLossScaler:
    """The dynamic loss scale and its step (module docstring). ``DynamicLossScaler(init_scale,
    *, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000, process_group=None,
    enabled=True)``; `process_group` is the group whose ranks must agree (None: the default
    group when torch.distributed is initialised, else this process alone). Disabled, it scales
    by 1 and always steps (bf16 needs no scaling). After each `update`, `steps` counts the
    updates and `skipped` lists the steps (0-based) that found an inf/NaN."""

    def __init__(self, init_scale: float = 2.0 ** 16, *, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 process_group: Any = None, enabled: bool = True) -> None:
        check_positive("DynamicLossScaler", "init_scale", init_scale)
        if not (isinstance(growth_factor, (int, float)) and growth_factor >= 1):
            raise ValueError(f"DynamicLossScaler: growth_factor must be a number >= 1 (1 for a "
                             f"static scale), got {growth_factor!r}")
        if not (isinstance(backoff_factor, (int, float)) and 0 < backoff_factor <= 1):
            raise ValueError(f"DynamicLossScaler: backoff_factor must be in (0, 1] (1 for a "
                             f"static scale), got {backoff_factor!r}")
        check_int("DynamicLossScaler", "growth_interval", growth_interval)
        self._scale = float(init_scale)
        self.growth_factor, self.backoff_factor = float(growth_factor), float(backoff_factor)
        self.growth_interval, self.group, self.enabled = growth_interval, process_group, enabled
        self.good_steps = 0
        self.steps = 0
        self.skipped: list[int] = []
        self._found: dict[int, bool] = {}  # id(optimizer) -> inf/NaN found, since last update

    @property
    def scale_value(self) -> float:
        """The current loss scale s (1.0 when disabled)."""
        return self._scale if self.enabled else 1.0

    def scale(self, loss: Tensor) -> Tensor:
        """loss · s: its backward makes every gradient s times larger."""
        return loss * self._scale if self.enabled else loss

    def _sync(self, found: Tensor) -> Tensor:
        """MAX of the inf/NaN flag over the ranks: every rank then decides the same."""
        if dist.is_available() and dist.is_initialized() and dist.get_world_size(self.group) > 1:
            dist.all_reduce(found, op=dist.ReduceOp.MAX, group=self.group)
        return found

    @torch.no_grad()
    def unscale_(self, optimizer: torch.optim.Optimizer) -> bool:
        """Divide this optimizer's gradients by s (once per step) and return whether any rank
        found an inf or NaN in its gradients."""
        if id(optimizer) in self._found:
            raise RuntimeError("DynamicLossScaler.unscale_: already unscaled since the last "
                               "update(); unscaling twice divides the gradients by s twice")
        inv = 1.0 / self.scale_value
        if hasattr(optimizer, "unscale_"):  # master weights: unscale into fp32 master gradients
            found = optimizer.unscale_(inv).to(torch.float32)
        else:
            found = None
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    if p.grad.dtype in (torch.float16, torch.bfloat16):
                        raise ValueError(
                            "DynamicLossScaler.unscale_: 16-bit gradients would underflow "
                            "again when divided in place; keep fp32 master weights "
                            "(toolkit.precision.MasterWeightOptimizer)")
                    p.grad.mul_(inv)
                    bad = (~torch.isfinite(p.grad)).any().to(torch.float32)
                    found = bad if found is None else torch.maximum(found, bad)
            if found is None:
                device = next((p.device for g in optimizer.param_groups for p in g["params"]),
                              None)
                found = torch.zeros((), dtype=torch.float32, device=device)
        found = found.reshape(1).clone()
        self._found[id(optimizer)] = bool(self._sync(found).item() > 0)
        return self._found[id(optimizer)]

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Unscale (unless `unscale_` was called), then step `optimizer` unless some rank found
        an inf/NaN. Returns True when it stepped."""
        if not self.enabled:
            optimizer.step()
            return True
        if id(optimizer) not in self._found:
            self.unscale_(optimizer)
        if self._found[id(optimizer)]:
            if hasattr(optimizer, "skip"):
                optimizer.skip()  # drop the master gradients of the skipped step
            return False
        optimizer.step()
        return True

    def update(self) -> None:
        """Back off after an inf/NaN, grow after `growth_interval` good steps in a row."""
        if not self.enabled:
            return
        if not self._found:
            raise RuntimeError("DynamicLossScaler.update: no step or unscale_ since the last "
                               "update(); call scaler.step(optimizer) first")
        found = any(self._found.values())
        if found:
            self.skipped.append(self.steps)
        self._scale, self.good_steps = next_scale(
            self._scale, self.good_steps, found, growth_factor=self.growth_factor,
            backoff_factor=self.backoff_factor, growth_interval=self.growth_interval)
        self.steps += 1
        self._found.clear()

    def state_dict(self) -> dict[str, Any]:
        """Everything a resume needs: the scale, the good steps in a row, the rule's settings,
        and the counters."""
        return {"scale": self._scale, "good_steps": self.good_steps, "steps": self.steps,
                "skipped": list(self.skipped), "growth_factor": self.growth_factor,
                "backoff_factor": self.backoff_factor, "growth_interval": self.growth_interval,
                "enabled": self.enabled}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` saved."""
        missing = {"scale", "good_steps", "growth_factor", "backoff_factor",
                   "growth_interval"} - set(state)
        if missing:
            raise ValueError(f"DynamicLossScaler.load_state_dict: missing {sorted(missing)}")
        self._scale, self.good_steps = float(state["scale"]), int(state["good_steps"])
        self.steps = int(state.get("steps", 0))
        self.skipped = list(state.get("skipped", []))
        self.growth_factor = float(state["growth_factor"])
        self.backoff_factor = float(state["backoff_factor"])
        self.growth_interval = int(state["growth_interval"])
        self.enabled = bool(state.get("enabled", True))
        self._found.clear()


__all__ = ["DynamicLossScaler", "next_scale"]
