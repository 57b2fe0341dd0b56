"""Linear layers whose matmuls read fp8 inputs, emulated: fp8 training of a real model on a CPU.

An fp8 GEMM multiplies fp8 numbers exactly and accumulates in higher precision (fp32, or fp32
every N_C terms: `toolkit.precision.accumulate`), so in value it equals a higher-precision matmul
of the *dequantised* inputs. That is what `Fp8Linear` computes, per recipe (`toolkit.precision
.fp8`), for the three GEMMs of a linear layer y = x Wᵀ + b (Micikevicius et al., "FP8 Formats
for Deep Learning", 2022; Transformer Engine's `te.Linear`):

    forward     y      = Q_fwd(x) · Q_fwd(W)ᵀ + b        (M, K) · (K, N) → (M, N)
    backward    dL/dx  = Q_bwd(g) · Q_fwd(W)             (M, N) · (N, K) → (M, K)
                dL/dW  = Q_bwd(g)ᵀ · Q_fwd(x)            (N, M) · (M, K) → (N, K)

with g = dL/dy; the bias gradient and everything outside the GEMMs stay in the input's precision
(DeepSeek-V3 §3.3.1 keeps the embedding, output head, normalisation and attention core in higher
precision too, so `use_fp8` skips the tied ``lm_head`` by default). The weights themselves stay
fp32 (the optimizer's masters); fp8 is only what the GEMMs read.

    recipe      Q_fwd / Q_bwd                                  scales per
    "unscaled"  e4m3 / e5m2, a plain cast                      none (scale 1: what scaling fixes)
    "delayed"   e4m3 / e5m2 (TE's HYBRID)                      tensor, from an amax history
    "current"   e4m3 / e5m2                                    tensor, this step's amax
    "mx"        e4m3 / e4m3                                    32 elements along a row (E8M0)
    "blocks"    e4m3 / e4m3 (DeepSeek-V3 uses e4m3 everywhere)   1×128 tiles (x, g), 128×128 (W)

Emulation only changes values the way the hardware's casts would; it does not run faster.
A block's scale multiplies out of a real GEMM only when the block lies along its contraction
dimension (the DeepSeek-V3 report describes re-quantising the forward's 1×128 activation tiles
as 128×1 tiles for the backward); dequantising first makes every layout exact here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from .fp8 import (DelayedScaler, DelayedScaling, Quantized, amax, current_scaling,
                  quantize_blocks, quantize_mx, quantize_tensor)

RECIPES = ("unscaled", "delayed", "current", "mx", "blocks")
"""The scaling recipes `Fp8Linear` emulates (module docstring)."""
ROLES = ("input", "weight", "grad")
"""The three tensors a linear layer's GEMMs read in fp8."""


@dataclass(frozen=True)
class Fp8Recipe:
    """How a linear layer's GEMM inputs are cast to fp8."""

    name: str = "delayed"
    """One of `RECIPES`."""
    margin: int = 0
    """Delayed scaling: the amax maps to fp8_max / 2^margin."""
    amax_history_len: int = 16
    """Delayed scaling: past amaxes the scale looks at (TE's default is 1024; a short run needs
    fewer)."""
    amax_compute_algo: str = "max"
    """Delayed scaling: "max" or "most_recent"."""

    def __post_init__(self) -> None:
        if self.name not in RECIPES:
            raise ValueError(f"Fp8Recipe: name must be one of {RECIPES}, got {self.name!r}")
        DelayedScaling(margin=self.margin, amax_history_len=self.amax_history_len,
                       amax_compute_algo=self.amax_compute_algo)  # validates them

    def fmt(self, role: str) -> str:
        """The fp8 format of a role: e5m2 for gradients in the per-tensor recipes, else e4m3."""
        per_tensor = self.name in ("unscaled", "delayed", "current")
        return "fp8 e5m2" if role == "grad" and per_tensor else "fp8 e4m3"


@dataclass
class RoleStats:
    """What one role's casts saw, call by call."""

    amaxes: list[float] = field(default_factory=list)
    """amax of the tensor at each call (the explorer of lesson 05 replays them)."""
    scaler: DelayedScaler | None = None
    """The delayed scaler of this role (recipe "delayed" only)."""


class Fp8Linear(nn.Module):
    """`linear`'s parameters (the same tensors: tied weights stay tied) with its three GEMMs
    on fp8 inputs under `recipe` (module docstring). x: (..., K) → (..., N)."""

    def __init__(self, linear: nn.Linear, recipe: Fp8Recipe | None = None) -> None:
        super().__init__()
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"Fp8Linear wraps an nn.Linear, got {type(linear).__name__}")
        self.recipe = recipe or Fp8Recipe()
        self.weight, self.bias = linear.weight, linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.stats = {role: RoleStats() for role in ROLES}
        if self.recipe.name == "delayed":
            for role in ROLES:
                self.stats[role].scaler = DelayedScaler(DelayedScaling(
                    fmt=self.recipe.fmt(role), margin=self.recipe.margin,
                    amax_history_len=self.recipe.amax_history_len,
                    amax_compute_algo=self.recipe.amax_compute_algo))

    def cast(self, role: str, t: Tensor) -> Tensor:
        """The values an fp8 GEMM reads for `t` (2-D) in this role: quantised, dequantised."""
        stats, name, fmt = self.stats[role], self.recipe.name, self.recipe.fmt(role)
        stats.amaxes.append(float(amax(t)))
        if name == "unscaled":
            q: Quantized = quantize_tensor(t, fmt, 1.0)
        elif name == "delayed":
            q = stats.scaler.quantize(t)
        elif name == "current":
            q = current_scaling(t, fmt)
        elif name == "mx":
            q = quantize_mx(t, fmt)
        else:
            q = quantize_blocks(t, fmt, block=(128, 128) if role == "weight" else (1, 128))
        return q.dequantize().to(t.dtype)

    def forward(self, x: Tensor) -> Tensor:
        return _Fp8Matmul.apply(x, self.weight, self.bias, self)

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, recipe={self.recipe.name!r}"


class _Fp8Matmul(torch.autograd.Function):
    """y = Q(x) Q(W)ᵀ + b forward; Q(g) Q(W) and Q(g)ᵀ Q(x) backward (module docstring)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None,
                layer: Fp8Linear) -> Tensor:
        x2 = x.reshape(-1, x.shape[-1])                   # (M, K)
        xq, wq = layer.cast("input", x2), layer.cast("weight", weight)
        y = xq @ wq.t()                                   # (M, K) @ (K, N) -> (M, N)
        if bias is not None:
            y = y + bias
        ctx.save_for_backward(xq, wq)
        ctx.layer, ctx.shape, ctx.has_bias = layer, x.shape, bias is not None
        return y.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        xq, wq = ctx.saved_tensors
        g2 = grad.reshape(-1, grad.shape[-1])             # (M, N)
        gq = ctx.layer.cast("grad", g2)
        grad_x = (gq @ wq).view(ctx.shape)                # (M, N) @ (N, K) -> (M, K)
        grad_w = gq.t() @ xq                              # (N, M) @ (M, K) -> (N, K)
        grad_b = g2.sum(0) if ctx.has_bias else None
        return grad_x, grad_w, grad_b, None


def use_fp8(model: nn.Module, recipe: Fp8Recipe | None = None, *,
            skip: tuple[str, ...] = ("lm_head",)) -> dict[str, Fp8Linear]:
    """Replace every `nn.Linear` of `model` whose name does not end with one of `skip` by an
    `Fp8Linear` over the same parameters, in place; returns them by qualified name."""
    swapped: dict[str, Fp8Linear] = {}
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.Linear) and not name.endswith(skip):
            parent_name, _, child = name.rpartition(".")
            layer = Fp8Linear(module, recipe)
            setattr(model.get_submodule(parent_name) if parent_name else model, child, layer)
            swapped[name] = layer
    if not swapped:
        raise ValueError("use_fp8: the model has no nn.Linear to replace (check `skip`)")
    return swapped


__all__ = ["Fp8Linear", "Fp8Recipe", "RECIPES", "ROLES", "RoleStats", "use_fp8"]
