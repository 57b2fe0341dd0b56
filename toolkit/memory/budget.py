"""A whole-model memory budget per device: model states (ZeRO stage, precision recipe) plus the
activations of one micro-batch, and whether it fits a GPU.

    total = params + grads + optimizer      (`model_state_bytes`, ZeRO §5)
          + L · activation_bytes_per_layer  (Korthikanti et al. 2022)

Left out, as in both papers' headline figures: temporary buffers (fused all-reduce buckets,
ZeRO-3's gathered unit), the embedding/logit activations, and allocator fragmentation, which
ZeRO §6.3 puts at up to ~30 % in practice; keep that much headroom when `fits` is marginal.
"""

from __future__ import annotations

from dataclasses import dataclass

from .activations import activation_bytes
from .shapes import ModelShape, model_shape
from .states import GiB, MIXED_ADAM, ModelStates, Recipe, model_state_bytes


@dataclass(frozen=True)
class Budget:
    """Bytes one device needs, by kind, and the verdict against its memory."""

    params: float
    """Bytes of parameters."""
    grads: float
    """Bytes of gradients."""
    optimizer: float
    """Bytes of optimizer state."""
    activations: float
    """Bytes of activations of one micro-batch through this device's layers."""
    gpu_bytes: float
    """The device's memory, bytes."""

    @property
    def model_states(self) -> float:
        """params + grads + optimizer."""
        return self.params + self.grads + self.optimizer

    @property
    def total(self) -> float:
        """Model states plus activations."""
        return self.model_states + self.activations

    @property
    def fits(self) -> bool:
        """True when the total is at most the device's memory."""
        return self.total <= self.gpu_bytes

    @property
    def headroom(self) -> float:
        """gpu_bytes − total (negative when it does not fit)."""
        return self.gpu_bytes - self.total

    def as_dict(self) -> dict[str, float]:
        """The four parts by name, in the order the stacked bars draw them."""
        return {"params": self.params, "grads": self.grads, "optimizer": self.optimizer,
                "activations": self.activations}


def budget(model: ModelShape | str, *, n_d: int = 1, stage: int = 0,
           recipe: Recipe = MIXED_ADAM, batch: int = 1, seq_len: int | None = None,
           gpu_bytes: float = 80 * GiB, tensor_parallel: int = 1,
           sequence_parallel: bool = False, recompute: str = "none") -> Budget:
    """Memory per device to train `model` (a `ModelShape` or a name in `MODELS`) with ZeRO
    `stage` over `n_d` data-parallel ranks, micro-batch `batch` at `seq_len` (default: the
    model's), against `gpu_bytes` (default an 80 GiB GPU).

    `tensor_parallel` = t divides Ψ by t for the model states (as if every parameter were
    split; Megatron-LM in fact replicates layer norms, a small share) and the activations as
    Korthikanti et al. describe.
    """
    shape = model_shape(model) if isinstance(model, str) else model
    if not isinstance(shape, ModelShape):
        raise TypeError(f"budget: model must be a ModelShape or a name, got {type(model).__name__}")
    if not gpu_bytes > 0:
        raise ValueError(f"budget: gpu_bytes must be > 0, got {gpu_bytes!r}")
    states = model_state_bytes(shape.num_params / tensor_parallel, n_d, stage, recipe)
    acts = activation_bytes(layers=shape.layers, seq_len=seq_len or shape.seq_len, batch=batch,
                            hidden=shape.hidden, heads=shape.heads,
                            tensor_parallel=tensor_parallel,
                            sequence_parallel=sequence_parallel, recompute=recompute)
    return Budget(states.params, states.grads, states.optimizer, acts, gpu_bytes)


def states_budget(states: ModelStates, *, activations: float = 0.0,
                  gpu_bytes: float = 80 * GiB) -> Budget:
    """A `Budget` from model states computed elsewhere (e.g. a raw parameter count)."""
    return Budget(states.params, states.grads, states.optimizer, activations, gpu_bytes)


__all__ = ["Budget", "budget", "states_budget"]
