"""Large-batch optimizers: LARS and LAMB, one step size per layer set by a trust ratio.

The linear scaling rule (Goyal et al. 2017; lesson 04) multiplies the learning rate by k when
the batch grows k×. Past some k one global step size no longer fits every layer: You, Gitman &
Ginsburg ("Large Batch Training of Convolutional Networks", 2017, arXiv:1708.03888, Table 1)
found the ratio ‖w‖/‖∇L(w)‖ varies by orders of magnitude between AlexNet's layers, so a
learning rate large enough for one layer makes another diverge. Their remedy gives layer l a
*local* learning rate proportional to how large its weights are compared with its update.

LARS (their Algorithm 1, SGD with momentum m and weight decay β; the decay of the global rate
γ is left to a scheduler)::

    λˡ = η · ‖wˡ‖ / (‖gˡ‖ + β‖wˡ‖)                  local lr, η the trust coefficient (0.001)
    vˡ ← m·vˡ + γ·λˡ·(gˡ + β·wˡ)
    wˡ ← wˡ − vˡ

LAMB (You et al., "Large Batch Optimization for Deep Learning: Training BERT in 76 minutes",
ICLR 2020, Algorithm 2) puts the same layer-wise ratio on Adam's update::

    m ← β₁m + (1−β₁)g,  v ← β₂v + (1−β₂)g²,  m̂ = m/(1−β₁ᵗ),  v̂ = v/(1−β₂ᵗ)
    r = m̂ / (√v̂ + ε)
    xˡ ← xˡ − η · φ(‖xˡ‖) / ‖rˡ + λxˡ‖ · (rˡ + λxˡ)     φ(z) = z here (the paper allows a clip)

So every layer moves by η·‖xˡ‖ per step (in norm), whatever the scale of its gradient: the
step is *relative*. Where ‖w‖ or the update's norm is 0 (a bias initialised at zero, a layer
without gradient) the ratio is taken as 1, as common implementations do; a param group with
``adapt=False`` (biases, LayerNorm, as BERT's LAMB does) always uses 1.

Shapes: each parameter is one "layer" (its own norm), so a Linear's weight and bias get their
own ratios. All state lives on the parameter's device (``zeros_like``). Both are plain
`torch.optim.Optimizer`s: with data parallelism every rank steps on the same averaged gradient,
so the ratios, computed from full tensors, are the same on every rank.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
from torch import Tensor

__all__ = ["LAMB", "LARS", "lamb_trust_ratio", "lars_local_lr"]


def lamb_trust_ratio(weight: Tensor, update: Tensor) -> Tensor:
    """‖weight‖ / ‖update‖, the factor of LAMB's Algorithm 2 (φ = identity), as a 0-d tensor
    on the weight's device; 1 where either norm is 0 (nothing to scale by)."""
    if weight.shape != update.shape:
        raise ValueError(f"lamb_trust_ratio: weight and update must have one shape, got "
                         f"{tuple(weight.shape)} and {tuple(update.shape)}")
    w, u = weight.norm(), update.norm()
    return torch.where((w > 0) & (u > 0), w / u.clamp_min(torch.finfo(u.dtype).tiny),
                       torch.ones_like(w))


def lars_local_lr(weight: Tensor, grad: Tensor, *, trust_coefficient: float,
                  weight_decay: float) -> Tensor:
    """LARS's local learning rate η·‖w‖/(‖g‖ + β‖w‖) (Algorithm 1), a 0-d tensor; 1 where ‖w‖
    or ‖g‖ is 0. Note the denominator adds the norms, it is not ‖g + βw‖."""
    w, g = weight.norm(), grad.norm()
    ratio = trust_coefficient * w / (g + weight_decay * w).clamp_min(torch.finfo(w.dtype).tiny)
    return torch.where((w > 0) & (g > 0), ratio, torch.ones_like(w))


def _check(owner: str, **values: float) -> None:
    for name, value in values.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{owner}: {name} must be a number >= 0, got {value!r}")


class LARS(torch.optim.Optimizer):
    """SGD with momentum and a layer-wise learning rate (You et al. 2017, Algorithm 1).

    ``lr`` is the global rate γ, ``momentum`` m, ``weight_decay`` β, ``trust_coefficient`` η.
    A param group with ``adapt=False`` skips the local rate (λ = 1: plain momentum SGD).
    """

    def __init__(self, params: Iterable[Any], lr: float, *, momentum: float = 0.9,
                 weight_decay: float = 0.0, trust_coefficient: float = 0.001,
                 adapt: bool = True) -> None:
        _check("LARS", lr=lr, momentum=momentum, weight_decay=weight_decay,
               trust_coefficient=trust_coefficient)
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                                      trust_coefficient=trust_coefficient, adapt=adapt))

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = None if closure is None else torch.enable_grad()(closure)()
        for group in self.param_groups:
            beta, eta = group["weight_decay"], group["trust_coefficient"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                local = (lars_local_lr(p, p.grad, trust_coefficient=eta, weight_decay=beta)
                         if group["adapt"] else torch.ones((), device=p.device, dtype=p.dtype))
                update = p.grad.add(p, alpha=beta) if beta else p.grad.clone()
                update.mul_(local * group["lr"])                      # γ·λ·(g + βw)
                state = self.state[p]
                if "velocity" not in state:
                    state["velocity"] = torch.zeros_like(p)
                v = state["velocity"].mul_(group["momentum"]).add_(update)   # v ← m·v + ...
                p.sub_(v)
        return loss


class LAMB(torch.optim.Optimizer):
    """Adam's update scaled per layer by ‖x‖/‖r + λx‖ (You et al., ICLR 2020, Algorithm 2).

    ``lr`` is η, ``betas`` (β₁, β₂), ``eps`` ε, ``weight_decay`` λ (decoupled, added to the
    update before the ratio). A param group with ``adapt=False`` uses ratio 1 (AdamW's step).
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, *,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0, adapt: bool = True) -> None:
        _check("LAMB", lr=lr, eps=eps, weight_decay=weight_decay)
        if not (len(betas) == 2 and all(0.0 <= b < 1.0 for b in betas)):
            raise ValueError(f"LAMB: betas must be two numbers in [0, 1), got {betas!r}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay, adapt=adapt))

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = None if closure is None else torch.enable_grad()(closure)()
        for group in self.param_groups:
            (b1, b2), lam = group["betas"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["m"], state["v"] = torch.zeros_like(p), torch.zeros_like(p)
                state["step"] += 1
                t = state["step"]
                m = state["m"].mul_(b1).add_(p.grad, alpha=1 - b1)
                v = state["v"].mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                # r = m̂ / (√v̂ + ε), with the bias corrections of Adam
                r = (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt_().add_(group["eps"]))
                if lam:
                    r.add_(p, alpha=lam)                               # r + λx
                ratio = lamb_trust_ratio(p, r) if group["adapt"] else 1.0
                p.sub_(r.mul_(ratio * group["lr"]))
        return loss
