"""Local SGD and DiLoCo: every rank takes H optimizer steps on its own, then the ranks average.

DDP all-reduces every gradient, Ψ elements per step. Local SGD (Stich, "Local SGD Converges
Fast and Communicates Little", ICLR 2019; Lin et al., "Don't Use Large Mini-Batches, Use Local
SGD", ICLR 2020) lets each of the k ranks step its own replica H times on its own data and
then replaces every replica by their average: one all-reduce of Ψ elements per H steps, so the
traffic per step falls by H. For plain or momentum SGD with H = 1 it *is* DDP: the average of
θ − γ·mᵢ is θ − γ·mean(mᵢ), and momentum is linear in the gradient (a test checks this).

DiLoCo (Douillard et al., "DiLoCo: Distributed Low-Communication Training of Language
Models", 2023, arXiv:2311.08105, Algorithm 1) treats the averaged movement as a gradient for
a second, *outer* optimizer::

    for outer step t = 1 … T:
        every worker i, in parallel:  θᵢ ← θ(t−1);  H steps of InnerOpt (AdamW) on its shard
                                      δᵢ = θ(t−1) − θᵢ                 (the outer gradient)
        Δ = (1/k)·Σᵢ δᵢ                                                (one all-reduce)
        θ(t) ← OuterOpt(θ(t−1), Δ)                                     (Nesterov momentum)

The paper's runs use AdamW inside and SGD with Nesterov momentum outside (outer learning rate
0.7, momentum 0.9) with H = 500. With an outer SGD of learning rate 1 and no momentum,
θ(t) = θ(t−1) − Δ = mean(θᵢ): DiLoCo reduces to local SGD (a test checks this too).

Both wrap an inner `torch.optim.Optimizer` and keep its surface: ``step()`` steps the inner
optimizer and, every ``sync_every`` calls, synchronises; ``zero_grad()``, ``param_groups``.
The parameters they synchronise are the inner optimizer's, each distinct tensor once (a tied
weight once, a frozen one never: it is not in the optimizer), flattened into one fp32 buffer:
the recorder sees exactly one all-reduce of 4Ψ bytes per synchronisation. Rank 0's
parameters are broadcast at construction, as DDP does. Inner optimizer state stays local (the
papers do not average it). Frozen parameters and buffers are neither averaged nor, unless
the model is passed as ``module=`` (then everything is broadcast, as DDP does), broadcast.
DiLoCo keeps two more flat vectors per rank, θ(t−1) and the outer
momentum: 2Ψ more memory than DDP.

Shapes: Ψ = Σ numel of the synchronised parameters; every flat buffer is (Ψ,) on the
parameters' device.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..arguments import check_int
from .ddp import broadcast_module

__all__ = ["DiLoCo", "LocalSGD"]


class LocalSGD:
    """``inner`` steps locally; every ``sync_every`` steps the parameters are averaged.

    ``step()`` returns True on the steps that synchronised. ``syncs`` counts them.
    """

    def __init__(self, inner: torch.optim.Optimizer, *, sync_every: int,
                 module: nn.Module | None = None, process_group: Any = None,
                 broadcast: bool = True) -> None:
        owner = type(self).__name__
        if not isinstance(inner, torch.optim.Optimizer):
            raise TypeError(f"{owner}(inner=...) must be a torch.optim.Optimizer over the model's "
                            f"parameters, got {type(inner).__name__}")
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(f"{owner} needs an initialised process group (start ranks with "
                               "toolkit.launch.spawn or torchrun)")
        self.inner = inner
        self.sync_every = check_int(owner, "sync_every", sync_every, hint="H, local steps")
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        seen: set[int] = set()
        self.params: list[Tensor] = []
        for group in inner.param_groups:
            for p in group["params"]:
                if id(p) not in seen:       # a tensor in two groups is still one tensor
                    seen.add(id(p))
                    self.params.append(p)
        if not self.params:
            raise ValueError(f"{owner}: the inner optimizer has no parameters")
        kinds = {(p.dtype, p.device) for p in self.params}
        if len(kinds) != 1:
            raise ValueError(f"{owner}: every parameter must share one dtype and device (one flat "
                             f"buffer), got {sorted(map(str, kinds))}; cast the model first")
        self.numel = sum(p.numel() for p in self.params)
        self.steps = 0
        self.syncs = 0
        if broadcast:   # every replica starts from rank 0's
            src = 0 if process_group is None else dist.get_global_rank(process_group, 0)
            if module is not None:
                broadcast_module(module, src=src, group=process_group)
            else:
                with torch.no_grad():
                    for p in self.params:
                        dist.broadcast(p.data, src=src, group=process_group)

    @property
    def param_groups(self) -> list[dict]:
        return self.inner.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none=set_to_none)

    def flat_parameters(self) -> Tensor:
        """A (Ψ,) copy of the synchronised parameters, in order."""
        return torch.cat([p.detach().reshape(-1) for p in self.params])

    def load_flat(self, flat: Tensor) -> None:
        """Write a (Ψ,) vector back into the parameters."""
        offset = 0
        with torch.no_grad():
            for p in self.params:
                p.copy_(flat[offset: offset + p.numel()].view_as(p))
                offset += p.numel()

    def step(self, closure: Callable[[], Any] | None = None) -> bool:
        """One local step of the inner optimizer; synchronise after every ``sync_every``-th."""
        self.inner.step(closure)
        self.steps += 1
        if self.steps % self.sync_every:
            return False
        self.synchronize()
        self.syncs += 1
        return True

    def synchronize(self) -> None:
        """Replace every replica by the average of all replicas: one all-reduce of Ψ."""
        flat = self.flat_parameters()
        flat.div_(self.world_size)   # divide first: the sum of means is the mean
        dist.all_reduce(flat, group=self.process_group)
        self.load_flat(flat)

    def state_dict(self) -> dict:
        return {"inner": self.inner.state_dict(), "steps": self.steps, "syncs": self.syncs}

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state["inner"])
        self.steps, self.syncs = state["steps"], state["syncs"]


class DiLoCo(LocalSGD):
    """Local SGD whose averaged movement Δ is the gradient of an outer optimizer.

    ``outer`` builds the outer optimizer from a list holding one flat parameter (θ(t−1));
    the default is the paper's SGD with Nesterov momentum (``outer_lr`` 0.7, ``momentum``
    0.9). ``outer=lambda ps: torch.optim.SGD(ps, lr=1.0)`` gives local SGD.
    """

    def __init__(self, inner: torch.optim.Optimizer, *, sync_every: int,
                 outer_lr: float = 0.7, momentum: float = 0.9,
                 outer: Callable[[list[Tensor]], torch.optim.Optimizer] | None = None,
                 module: nn.Module | None = None, process_group: Any = None,
                 broadcast: bool = True) -> None:
        super().__init__(inner, sync_every=sync_every, module=module,
                         process_group=process_group, broadcast=broadcast)
        # θ(t−1), the point every worker started this round from: the same on every rank.
        self.anchor = torch.nn.Parameter(self.flat_parameters(), requires_grad=False)
        if outer is None:
            self.outer = torch.optim.SGD([self.anchor], lr=outer_lr, momentum=momentum,
                                         nesterov=momentum > 0)
        else:
            self.outer = outer([self.anchor])

    def synchronize(self) -> None:
        """Δ = mean over ranks of θ(t−1) − θᵢ (one all-reduce of Ψ); θ(t) = OuterOpt step."""
        delta = self.anchor.detach() - self.flat_parameters()    # δᵢ, (Ψ,)
        delta.div_(self.world_size)
        dist.all_reduce(delta, group=self.process_group)         # Δ, the same on every rank
        self.anchor.grad = delta
        self.outer.step()
        self.anchor.grad = None
        self.load_flat(self.anchor.detach())                     # θᵢ ← θ(t)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "anchor": self.anchor.detach().clone(),
                "outer": self.outer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        with torch.no_grad():
            self.anchor.copy_(state["anchor"])
        self.outer.load_state_dict(state["outer"])
