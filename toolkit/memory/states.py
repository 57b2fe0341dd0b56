"""Bytes of model states (parameters, gradients, optimizer states) per device under data
parallelism and ZeRO stages 1-3.

Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
SC 2020, §3.1 and §5 (Figure 1). With Ψ parameters, N_d data-parallel ranks and a precision
recipe of p bytes per parameter, g per gradient and K of optimizer state:

    stage 0 (plain data parallel)   (p + g + K)·Ψ                 mixed Adam: 16Ψ
    stage 1 (shard optimizer)       (p + g)·Ψ + K·Ψ/N_d                       4Ψ + 12Ψ/N_d
    stage 2 (+ shard gradients)     p·Ψ + (g + K)·Ψ/N_d                       2Ψ + 14Ψ/N_d
    stage 3 (+ shard parameters)    (p + g + K)·Ψ/N_d                         16Ψ/N_d

Mixed-precision Adam keeps fp16/bf16 parameters (2 bytes) and gradients (2), plus fp32 master
weights, momentum and variance (4 + 4 + 4 = K = 12). Gradients and optimizer states exist only
for trainable parameters, so `frozen` parameters count in p·Ψ alone.

A flat-sharded implementation pads Ψ up to a multiple of N_d so that every rank holds
⌈Ψ/N_d⌉ elements of each sharded state; `padded=True` predicts exactly that.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..arguments import check_int

STAGES = (0, 1, 2, 3)
"""ZeRO stages: 0 is plain data parallelism (everything replicated)."""
GB = 1e9
"""The ZeRO paper's gigabyte (decimal): 16 · 7.5e9 bytes = 120 GB."""
GiB = 2 ** 30
"""A GPU's memory size is quoted in binary gigabytes (an 80 GB A100 holds 80 GiB)."""


@dataclass(frozen=True)
class Recipe:
    """Bytes per parameter of each model state, for one precision and optimizer."""

    name: str
    """Short label shown in tables and widgets."""
    param_bytes: float
    """Bytes of the working copy of one parameter (2 for fp16/bf16, 4 for fp32)."""
    grad_bytes: float
    """Bytes of one parameter's gradient."""
    optimizer_bytes: float
    """K: bytes of optimizer state per parameter (master weights included when kept)."""

    def __post_init__(self) -> None:
        for field in ("param_bytes", "grad_bytes", "optimizer_bytes"):
            value = getattr(self, field)
            if not (isinstance(value, (int, float)) and value >= 0):
                raise ValueError(f"Recipe: {field} must be a number >= 0, got {value!r}")

    @property
    def total_bytes(self) -> float:
        """p + g + K: bytes per parameter with nothing sharded (16 for mixed-precision Adam)."""
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes


MIXED_ADAM = Recipe("mixed-precision Adam", 2, 2, 12)
"""fp16/bf16 params and grads; fp32 master weights, momentum, variance (ZeRO §3.1)."""
FP32_ADAM = Recipe("fp32 Adam", 4, 4, 8)
"""fp32 params and grads; momentum and variance (torch.optim.Adam in fp32)."""
SGD_MOMENTUM = Recipe("fp32 SGD + momentum", 4, 4, 4)
"""fp32 params and grads; one momentum buffer."""
SGD = Recipe("fp32 SGD", 4, 4, 0)
"""fp32 params and grads; plain SGD keeps no state."""
RECIPES = {r.name: r for r in (MIXED_ADAM, FP32_ADAM, SGD_MOMENTUM, SGD)}
"""Every named recipe, by name."""


@dataclass(frozen=True)
class ModelStates:
    """Bytes of model states one device holds."""

    params: float
    """Bytes of parameters (working copy)."""
    grads: float
    """Bytes of gradients."""
    optimizer: float
    """Bytes of optimizer state (master weights included when the recipe keeps them)."""

    @property
    def total(self) -> float:
        """params + grads + optimizer."""
        return self.params + self.grads + self.optimizer


def shard_numel(numel: int, n_d: int) -> int:
    """Elements each of `n_d` ranks holds when `numel` elements are flat-sharded with padding:
    ⌈numel / n_d⌉ (the padding is n_d·⌈numel/n_d⌉ − numel < n_d elements)."""
    check_int("shard_numel", "numel", numel, low=0)
    check_int("shard_numel", "n_d", n_d)
    return -(-numel // n_d)


def model_state_bytes(num_params: float, n_d: int = 1, stage: int = 0,
                      recipe: Recipe = MIXED_ADAM, *, frozen: float = 0,
                      padded: bool = False) -> ModelStates:
    """Bytes of parameters, gradients and optimizer state per device (ZeRO §5, table above).

    `num_params` is Ψ (all parameters), `frozen` how many of them take no gradient and no
    optimizer state, `n_d` the data-parallel degree, `stage` 0-3. `padded=True` counts what a
    flat-sharded implementation stores for stages 1-3: the flat buffer is padded to
    N_d·⌈Ψ/N_d⌉ elements, so a sharded state holds ⌈Ψ/N_d⌉ and a replicated one N_d·⌈Ψ/N_d⌉
    (stage 0 is never padded). Without it, the paper's exact Ψ/N_d and Ψ. Flat groups padded
    separately (one per FSDP unit) add up: sum the predictions of each group.
    """
    check_int("model_state_bytes", "n_d", n_d)
    if stage not in STAGES:
        raise ValueError(f"model_state_bytes: stage must be one of {STAGES}, got {stage!r}")
    if not isinstance(recipe, Recipe):
        raise TypeError(f"model_state_bytes: recipe must be a Recipe, got {type(recipe).__name__}")
    if not (num_params >= 0 and 0 <= frozen <= num_params):
        raise ValueError(f"model_state_bytes: need num_params >= 0 and 0 <= frozen <= "
                         f"num_params, got num_params={num_params!r}, frozen={frozen!r}")
    trainable = num_params - frozen

    def share(numel: float, sharded: bool) -> float:
        if padded and stage >= 1:
            per_rank = shard_numel(int(numel), n_d)
            return per_rank if sharded else n_d * per_rank
        return numel / n_d if sharded else numel

    return ModelStates(
        params=recipe.param_bytes * share(num_params, stage >= 3),
        grads=recipe.grad_bytes * share(trainable, stage >= 2),
        optimizer=recipe.optimizer_bytes * share(trainable, stage >= 1),
    )


__all__ = ["FP32_ADAM", "GB", "MIXED_ADAM", "RECIPES", "SGD", "SGD_MOMENTUM", "STAGES", "GiB",
           "ModelStates", "Recipe", "model_state_bytes", "shard_numel"]
