"""Bytes per memory tier (GPU, CPU, NVMe) when model states are offloaded: ZeRO-Offload and
ZeRO-Infinity, on top of the ZeRO stages of `states`.

A `Placement` puts each model state of a ZeRO stage in a tier; the bytes are the stage's
(`model_state_bytes`, ZeRO §5), only *where* they live changes. Per rank, Ψ parameters, N_d
data-parallel ranks, mixed-precision Adam (2 + 2 + 12 bytes per parameter):

    placement                          stage  GPU                CPU                    NVMe
    none (ZeRO-2)                        2    2Ψ + 14Ψ/N_d       0                      0
    ZeRO-Offload (Ren et al. 2021)       2    2Ψ                 2Ψ/N_d + 12Ψ/N_d       0
    ZeRO-Infinity, CPU (SC 2021)         3    working            16Ψ/N_d                0
    ZeRO-Infinity, NVMe                  3    working            0                      16Ψ/N_d

ZeRO-Offload (USENIX ATC 2021, §3, its offload strategy) keeps the fp16 parameters on the GPU
and the fp16 gradients and the fp32 master weights, momentum and variance on the CPU, partitioned
as in ZeRO-2 when there are several GPUs (§4.2): GPU memory falls from 16Ψ to 2Ψ.
ZeRO-Infinity (§3 and its table of memory requirements) counts 20 bytes per parameter (fp16
parameters and gradients, fp32 parameters, momentum, variance and *gradients*: `INFINITY_ADAM`),
shards them all (stage 3) and keeps them on the CPU or NVMe; the GPU then needs only a *working
memory*: the fp16 parameters and gradients of the largest single operator, 4 bytes per parameter
of it, 16·h² for the h × 4h linear layer of a transformer of hidden size h (`working_bytes`).
It also offloads activation checkpoints to the CPU (§5).

`largest_model` inverts the table: the bytes are linear in Ψ, so the largest model that fits is
the smallest of capacity / (bytes per parameter) over the tiers. Hardware of the papers' claims
in `DGX2` (NVIDIA DGX-2 datasheet: 16 V100 32 GB, 1.5 TB of system memory, 30 TB of NVMe).
Pure functions: numbers in, numbers out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from .activations import activation_bytes
from .shapes import ModelShape, model_shape
from .states import GiB, MIXED_ADAM, STAGES, Recipe, model_state_bytes

TIERS = ("gpu", "cpu", "nvme")
"""Memory tiers, fastest first."""
PARTS = ("params", "grads", "optimizer", "working", "activations")
"""What a tier holds, by kind."""
INFINITY_ADAM = Recipe("mixed-precision Adam, fp32 gradients (ZeRO-Infinity)", 2, 2, 16)
"""ZeRO-Infinity §3: fp16 params and grads (2 + 2); fp32 params, momentum, variance and
gradients (4 × 4): 20 bytes per parameter, 240·L·h² for a transformer of 12·L·h² parameters."""
TB = 1e12
"""Decimal terabyte (disk sizes)."""
TiB = 2 ** 40
"""Binary terabyte (ZeRO-Infinity's §3 table counts model states in it)."""


@dataclass(frozen=True)
class Placement:
    """Which tier holds each model state, on top of a ZeRO stage."""

    name: str
    stage: int
    """ZeRO stage whose sharding the placement keeps (`model_state_bytes`)."""
    params: str = "gpu"
    """Tier of the (working-precision) parameters."""
    grads: str = "gpu"
    """Tier of the gradients."""
    optimizer: str = "gpu"
    """Tier of the optimizer state (master weights included when the recipe keeps them)."""
    activations: str = "gpu"
    """Tier of the stored activations (checkpoints); the layer being computed stays on GPU."""

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            raise ValueError(f"Placement: stage must be one of {STAGES}, got {self.stage!r}")
        for part in ("params", "grads", "optimizer", "activations"):
            if getattr(self, part) not in TIERS:
                raise ValueError(f"Placement: {part} must be one of {TIERS}, "
                                 f"got {getattr(self, part)!r}")

    @property
    def needs_working(self) -> bool:
        """Parameters live off the GPU, so the running operator's must be brought in."""
        return self.params != "gpu"


NO_OFFLOAD = Placement("ZeRO-2, no offload", 2)
ZERO_OFFLOAD = Placement("ZeRO-Offload", 2, grads="cpu", optimizer="cpu")
INFINITY_CPU = Placement("ZeRO-Infinity (CPU)", 3, "cpu", "cpu", "cpu", "cpu")
INFINITY_NVME = Placement("ZeRO-Infinity (NVMe)", 3, "nvme", "nvme", "nvme", "cpu")
PLACEMENTS = {p.name: p for p in (NO_OFFLOAD, ZERO_OFFLOAD, INFINITY_CPU, INFINITY_NVME)}
"""The placements of the module docstring, by name."""


@dataclass(frozen=True)
class Machine:
    """Memory of one node, per tier."""

    name: str
    gpus: int
    gpu_bytes: float
    """Memory of one GPU."""
    cpu_bytes: float
    """Host memory of the node."""
    nvme_bytes: float
    """NVMe capacity of the node."""

    def per_rank(self) -> dict[str, float]:
        """Each tier's capacity for one of `gpus` ranks (host and NVMe shared evenly)."""
        return {"gpu": self.gpu_bytes, "cpu": self.cpu_bytes / self.gpus,
                "nvme": self.nvme_bytes / self.gpus}


DGX2 = Machine("DGX-2", 16, 32 * GiB, 1.5 * TiB, 30 * TB)
"""NVIDIA DGX-2 datasheet: 16 V100 of 32 GB, 1.5 TB of system memory, 30 TB of NVMe (8 × 3.84
TB): the node of ZeRO-Offload's and ZeRO-Infinity's experiments."""


@dataclass(frozen=True)
class TierBytes:
    """Bytes one rank keeps in each tier, by part."""

    parts: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """tier → part → bytes (missing: 0)."""

    def tier(self, name: str) -> float:
        """All bytes in tier `name`."""
        if name not in TIERS:
            raise ValueError(f"TierBytes.tier: name must be one of {TIERS}, got {name!r}")
        return float(sum(self.parts.get(name, {}).values()))

    @property
    def gpu(self) -> float:
        return self.tier("gpu")

    @property
    def cpu(self) -> float:
        return self.tier("cpu")

    @property
    def nvme(self) -> float:
        return self.tier("nvme")

    def fits(self, capacity: Mapping[str, float]) -> bool:
        """Every tier within `capacity` (tier → bytes; a tier left out has none)."""
        return all(self.tier(t) <= capacity.get(t, 0.0) for t in TIERS)


def working_bytes(hidden: int, *, bytes_per_param: float = 4) -> float:
    """ZeRO-Infinity's GPU working memory for model states (§3 and its table): fp16 parameters
    and gradients (4 bytes) of the largest operator, the h × 4h linear layer: 16·h² bytes."""
    if not hidden > 0:
        raise ValueError(f"working_bytes: hidden must be > 0, got {hidden!r}")
    return bytes_per_param * 4 * hidden * hidden


def offload_bytes(num_params: float, placement: Placement, *, n_d: int = 1,
                  recipe: Recipe = MIXED_ADAM, working: float = 0.0, activations: float = 0.0,
                  padded: bool = False) -> TierBytes:
    """Bytes per rank in each tier (module docstring's table): the model states of
    `placement.stage` over `n_d` ranks (`model_state_bytes`), each put in its tier, plus
    `working` bytes on the GPU when the parameters live off it, and `activations` in
    `placement.activations`."""
    if not isinstance(placement, Placement):
        raise TypeError(f"offload_bytes: placement must be a Placement, got "
                        f"{type(placement).__name__}")
    states = model_state_bytes(num_params, n_d, placement.stage, recipe, padded=padded)
    parts: dict[str, dict[str, float]] = {t: {} for t in TIERS}
    parts[placement.params]["params"] = states.params
    parts[placement.grads]["grads"] = states.grads
    parts[placement.optimizer]["optimizer"] = states.optimizer
    if placement.needs_working and working:
        parts["gpu"]["working"] = working
    if activations:
        parts[placement.activations]["activations"] = activations
    return TierBytes(parts)


def offload_budget(model: ModelShape | str, placement: Placement, *, n_d: int = 1,
                   recipe: Recipe = MIXED_ADAM, batch: int = 1, seq_len: int | None = None,
                   recompute: str = "full") -> TierBytes:
    """Lesson 07's budget (`budget`) per tier: `model`'s states placed by `placement`, the
    activations of one micro-batch (full recomputation by default: the checkpoints that
    ZeRO-Infinity offloads), and the working memory of the largest operator (`working_bytes`,
    or the embedding V·h when larger, at the same 4 bytes per parameter)."""
    shape = model_shape(model) if isinstance(model, str) else model
    acts = activation_bytes(layers=shape.layers, seq_len=seq_len or shape.seq_len, batch=batch,
                            hidden=shape.hidden, heads=shape.heads, recompute=recompute)
    largest = max(working_bytes(shape.hidden), 4.0 * shape.vocab * shape.hidden)
    return offload_bytes(shape.num_params, placement, n_d=n_d, recipe=recipe, working=largest,
                         activations=acts)


def largest_model(placement: Placement, capacity: Mapping[str, float], *, n_d: int = 1,
                  recipe: Recipe = MIXED_ADAM, reserved: Mapping[str, float] | None = None
                  ) -> float:
    """The largest Ψ whose model states fit `capacity` (tier → bytes per rank) once `reserved`
    (tier → bytes: activations, working memory) is set aside: min over the tiers in use of
    (capacity − reserved) / (bytes per parameter there). 0 when a needed tier has no room."""
    per_param = offload_bytes(1.0, placement, n_d=n_d, recipe=recipe)
    reserved = reserved or {}
    limits = []
    for t in TIERS:
        need = per_param.tier(t)
        if need > 0:
            limits.append(max(0.0, capacity.get(t, 0.0) - reserved.get(t, 0.0)) / need)
    return min(limits) if limits else float("inf")


__all__ = ["DGX2", "INFINITY_ADAM", "INFINITY_CPU", "INFINITY_NVME", "NO_OFFLOAD", "PARTS",
           "PLACEMENTS", "TB", "TIERS", "TiB", "TierBytes", "Machine", "Placement",
           "ZERO_OFFLOAD", "largest_model", "offload_bytes", "offload_budget", "working_bytes"]
