"""The settings a user meets in DeepSpeed, Hugging Face Accelerate, torchtitan and Megatron-Core,
read as the course's concepts, with what each does to a rank's bytes. Pure numbers: no process,
no framework imported.

A framework's configuration names the same few quantities the lessons derive:

    batch        B = b · k · d          micro-batch b, k accumulation steps, d data-parallel ranks
                                        (DeepSpeed's config JSON: train_batch_size must equal
                                        train_micro_batch_size_per_gpu · gradient_accumulation_steps
                                        · number of GPUs; lesson 01)
    model states (p + g + K)·Ψ per rank, divided by d for the states the ZeRO stage shards
                                        (Rajbhandari et al., SC 2020, §5; model_state_bytes)
    layout       world = dp · tp · pp · cp (ep folded into dp · cp; lessons 12-14)

`SETTINGS` lists every setting of the lesson's table: its key as the user writes it, the
course's concept and where it is taught, what it does to bytes or memory, and the framework's
own documentation (checked against each project's docs and, for the runs here, against the
installed source). `deepspeed_config` writes the JSON a course run corresponds to;
`from_deepspeed` reads one back into a `Layout`, checking DeepSpeed's batch identity;
`layout_bytes` is what a layout costs a rank.

    cfg = deepspeed_config(micro_batch=4, accumulation=2, world_size=2, stage=2)
    layout = from_deepspeed(cfg, world_size=2)          # Layout(dp=2, zero_stage=2, ...)
    layout_bytes(layout, num_params=7e9).device / GB     # model states on each rank's device
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .arguments import check_int
from .memory import FP32_ADAM, MIXED_ADAM, STAGES, Recipe, model_state_bytes

DEEPSPEED_DOC = "https://www.deepspeed.ai/docs/config-json/"
ACCELERATE_DOC = "https://huggingface.co/docs/accelerate/package_reference/accelerator"
ACCELERATE_FSDP_DOC = "https://huggingface.co/docs/accelerate/usage_guides/fsdp"
TORCHTITAN_DOC = "https://github.com/pytorch/torchtitan/blob/main/torchtitan/config/configs.py"
MEGATRON_DOC = ("https://docs.nvidia.com/megatron-core/developer-guide/latest/apidocs/core/"
                "core.model_parallel_config.html")
MEGATRON_DP_DOC = ("https://docs.nvidia.com/megatron-core/developer-guide/latest/user-guide/"
                   "parallelism-guide.html")
OFFLOAD_DEVICES = ("none", "cpu", "nvme")


@dataclass(frozen=True)
class Setting:
    """One setting of one framework, in the course's terms."""

    framework: str
    key: str
    """As the user writes it (a JSON path, a keyword argument, a config field)."""
    concept: str
    """The course's name for it, and the lesson or toolkit object that teaches it."""
    effect: str
    """What it does to bytes per rank (memory or traffic), as a formula where there is one."""
    doc: str
    """The framework's own documentation of the setting."""


def _rows(framework: str, doc: str, rows: tuple[tuple[str, str, str], ...]) -> tuple[Setting, ...]:
    return tuple(Setting(framework, key, concept, effect, doc) for key, concept, effect in rows)


SETTINGS: tuple[Setting, ...] = _rows("DeepSpeed", DEEPSPEED_DOC, (
    ("train_micro_batch_size_per_gpu", "micro-batch b (lesson 01)",
     "activations grow with b; no bytes on the wire"),
    ("gradient_accumulation_steps", "k micro-batches per step (lesson 01, accumulate_gradients)",
     "DeepSpeed's stages 0-1 reduce once per step, stages 2-3 every micro-batch (k× the "
     "reduce traffic; recorded in lesson 16)"),
    ("train_batch_size", "B = b·k·d (lesson 01)", "must equal b·k·d, else DeepSpeed refuses"),
    ("gradient_clipping", "clip the global gradient norm (lesson 05's all-reduced flag, "
     "for a norm)", "one more all-reduce of a scalar per step; default 1.0, not off"),
    ("zero_optimization.stage", "ZeRO stage 0-3 (lessons 07-08: ShardedOptimizer, "
     "FullyShardedDataParallel)", "(p+g+K)Ψ → the sharded parts /d; traffic 2Ψ (0-2), 3Ψ (3)"),
    ("zero_optimization.offload_optimizer.device", "ZeRO-Offload: optimizer states on the "
     "CPU or NVMe (lesson 09, OffloadOptimizer)", "KΨ/d leaves the device; 2Ψ/d crosses PCIe "
     "each way per step"),
    ("zero_optimization.offload_param.device", "ZeRO-Infinity: parameters off the device "
     "(lesson 09; stage 3 only)", "pΨ/d leaves the device; every gather reads it back"),
    ("zero_optimization.reduce_bucket_size", "bucket size (lesson 04, DDP buckets)",
     "messages per step = gradient bytes / bucket; same total bytes"),
    ("zero_optimization.overlap_comm", "overlap communication with backward (lesson 04)",
     "no change in bytes; hides their time"),
    ("bf16.enabled", "bf16 mixed precision (lesson 05): 2-byte params and grads, fp32 master",
     "p = g = 2 bytes, K = 12 with Adam (16Ψ in all); halves the gradient bytes"),
    ("fp16.enabled, fp16.loss_scale = 0", "fp16 with dynamic loss scaling (lesson 05)",
     "as bf16, plus an all-reduced overflow flag per step"),
)) + _rows("Accelerate", ACCELERATE_DOC, (
    ("Accelerator(gradient_accumulation_steps=k) + accumulate()",
     "k micro-batches, no_sync() but the last (lesson 01)", "one all-reduce per step, not per "
     "micro-batch"),
    ("Accelerator(mixed_precision='bf16')", "autocast to bf16 (lesson 05)",
     "activations halve; parameters, gradients and their all-reduce stay fp32"),
    ("Accelerator(cpu=True)", "gloo on CPU ranks (lesson 00)", "DDP only: FSDP is not offered"),
)) + _rows("Accelerate", ACCELERATE_FSDP_DOC, (
    ("FullyShardedDataParallelPlugin(fsdp_version=2)", "FSDP2, fully_shard (lesson 08)",
     "(p+g+K)Ψ/d per rank; 3Ψ per step (1.5× DDP); ignored on CPU (section 8)"),
    ("FullyShardedDataParallelPlugin(reshard_after_forward=False)", "ZeRO-2-like: keep the "
     "gathered parameters from forward to backward (lesson 08)", "one gather fewer per unit "
     "per step (2Ψ), pΨ·(d−1)/d more held"),
    ("FullyShardedDataParallelPlugin(cpu_offload=True)", "offload (lesson 09)",
     "sharded states live in host memory"),
)) + _rows("torchtitan", TORCHTITAN_DOC, (
    ("parallelism.data_parallel_shard_degree", "FSDP2 degree (lesson 08); -1: the ranks left",
     "(p+g+K)Ψ/d_shard per rank"),
    ("parallelism.data_parallel_replicate_degree", "HSDP replicas (lesson 08)",
     "states replicated across replicas; gradients all-reduced across them"),
    ("parallelism.tensor_parallel_degree", "Megatron TP, f and g (lesson 12)",
     "Ψ/tp per rank; 4 all-reduces of s·b·h per layer and step"),
    ("parallelism.pipeline_parallel_degree, pipeline_parallel_schedule", "pipeline stages and "
     "schedule (lessons 10-11: GPipe, 1F1B, interleaved, ZB)", "Ψ/pp per rank; bubble "
     "(pp−1)/(m+pp−1)"),
    ("parallelism.context_parallel_degree", "ring attention (lessons 12, 14)",
     "activations /cp; keys and values passed round the ring"),
    ("parallelism.expert_parallel_degree", "experts over ranks (lesson 13)",
     "expert weights /ep; two all-to-alls per MoE layer"),
    ("parallelism.fsdp_reshard_after_forward", "reshard after forward (lesson 08)",
     "'never': one gather fewer per step, parameters held through backward"),
    ("compile.enable", "torch.compile of model and loss", "no change in bytes on the wire; "
     "fewer activation bytes where ops fuse"),
    ("model_registry(..., converters=[Float8LinearConverter.Config(recipe_name='rowwise')])",
     "fp8 GEMMs with scales (lesson 05)",
     "1-byte GEMM inputs; weights and gradients stay bf16/fp32"),
    ("checkpoint.interval, checkpoint.async_mode", "checkpoints (lesson 04: save_checkpoint)",
     "each rank writes its shard (DCP) every interval steps"),
    ("activation_checkpoint: FullAC / SelectiveAC (mode = 'full' | 'selective' in earlier "
     "releases' TOML)", "recomputation (Chen et al.; Korthikanti et al.; lesson 07)",
     "activations ~2sbh per layer (full) for one extra forward"),
)) + _rows("Megatron-Core", MEGATRON_DOC, (
    ("tensor_model_parallel_size (--tensor-model-parallel-size)", "TP (lesson 12)",
     "Ψ/tp per rank; 4 all-reduces of s·b·h per layer and step"),
    ("sequence_parallel", "sequence parallel (Korthikanti et al.; lesson 12)",
     "all-reduce → reduce-scatter + all-gather, same bytes; activations /tp"),
    ("pipeline_model_parallel_size", "pipeline stages (lesson 10)", "Ψ/pp per rank"),
    ("virtual_pipeline_model_parallel_size", "interleaved 1F1B, v chunks (lesson 10)",
     "bubble (pp−1)/(v·m + pp−1); v× the point-to-point messages"),
    ("context_parallel_size", "ring attention (lessons 12, 14)", "activations /cp"),
    ("expert_model_parallel_size", "EP (lesson 13), folded with dp·cp",
     "expert weights /ep; all-to-all dispatch and combine"),
)) + _rows("Megatron-Core", MEGATRON_DP_DOC, (
    ("DistributedDataParallelConfig(use_distributed_optimizer=True)", "ZeRO-1 (lesson 07: "
     "ShardedOptimizer(stage=1))", "K Ψ/d per rank; reduce-scatter + all-gather, 2Ψ"),
    ("DistributedDataParallelConfig(overlap_grad_reduce=True)", "bucketed overlap (lesson 04)",
     "no change in bytes; hides their time"),
    ("--use-megatron-fsdp, --data-parallel-sharding-strategy optim_grads_params",
     "ZeRO-3 / FSDP (lesson 08)", "(p+g+K)Ψ/d per rank; 3Ψ per step"),
))
"""The lesson's table: every setting mapped to a course concept and its effect on bytes."""


@dataclass(frozen=True)
class Layout:
    """What a framework configuration means in the course's terms (one rank's view)."""

    dp: int
    """Data-parallel degree d."""
    zero_stage: int = 0
    micro_batch: int = 1
    """Samples per rank per forward/backward (b)."""
    accumulation: int = 1
    """Micro-batches per optimizer step (k)."""
    recipe: Recipe = FP32_ADAM
    """Bytes per parameter of weights, gradients and optimizer states."""
    offload_optimizer: str = "none"
    """Where the optimizer states live: on the device, or ``"cpu"`` / ``"nvme"``."""
    offload_params: str = "none"
    clip: float = 0.0
    """Global gradient-norm clip (0: none)."""

    def __post_init__(self) -> None:
        check_int("Layout", "dp", self.dp)
        check_int("Layout", "micro_batch", self.micro_batch)
        check_int("Layout", "accumulation", self.accumulation)
        if self.zero_stage not in STAGES:
            raise ValueError(f"Layout: zero_stage must be one of {STAGES}, got "
                             f"{self.zero_stage!r}")
        for name in ("offload_optimizer", "offload_params"):
            if getattr(self, name) not in OFFLOAD_DEVICES:
                raise ValueError(f"Layout: {name} must be one of {OFFLOAD_DEVICES}, got "
                                 f"{getattr(self, name)!r}")
        if self.offload_params != "none" and self.zero_stage != 3:
            raise ValueError("Layout: offloading parameters needs ZeRO stage 3 (DeepSpeed's "
                             f"offload_param), got stage {self.zero_stage}")

    @property
    def global_batch(self) -> int:
        """B = b · k · d samples per optimizer step."""
        return self.micro_batch * self.accumulation * self.dp


def deepspeed_config(*, micro_batch: int, accumulation: int, world_size: int, stage: int,
                     bf16: bool = False, clip: float | None = 0.0,
                     offload_optimizer: str = "none") -> dict[str, Any]:
    """The DeepSpeed config JSON (as a dict) of a data-parallel run of `world_size` ranks.

    ``clip=None`` leaves ``gradient_clipping`` out, so DeepSpeed's default applies (1.0 in
    DeepSpeed 0.19: section 7 of lesson 16 measures it); 0.0 turns clipping off."""
    for name, value in (("micro_batch", micro_batch), ("accumulation", accumulation),
                        ("world_size", world_size)):
        check_int("deepspeed_config", name, value)
    if stage not in STAGES:
        raise ValueError(f"deepspeed_config: stage must be one of {STAGES}, got {stage!r}")
    zero: dict[str, Any] = {"stage": stage}
    if offload_optimizer != "none":
        zero["offload_optimizer"] = {"device": offload_optimizer}
    config: dict[str, Any] = {
        "train_batch_size": micro_batch * accumulation * world_size,
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": accumulation,
        "zero_optimization": zero,
        # A torch optimizer passed in, not one named in the JSON: DeepSpeed checks ZeRO with
        # the optimizers it knows and asks for this flag for any other.
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": bf16},
        "steps_per_print": 10 ** 9,   # no progress lines
    }
    if clip is not None:
        config["gradient_clipping"] = clip
    return config


def _device(section: Mapping[str, Any] | None) -> str:
    device = (section or {}).get("device", "none")
    return "none" if device is None else str(device)


def from_deepspeed(config: Mapping[str, Any], *, world_size: int) -> Layout:
    """Read a DeepSpeed config JSON (a dict) for `world_size` data-parallel ranks as a
    `Layout`, with DeepSpeed's own rules: any two of train_batch_size,
    train_micro_batch_size_per_gpu and gradient_accumulation_steps give the third, and all three
    must satisfy B = b · k · d; gradient_clipping defaults to 1.0."""
    check_int("from_deepspeed", "world_size", world_size)
    B = config.get("train_batch_size")
    b = config.get("train_micro_batch_size_per_gpu")
    k = config.get("gradient_accumulation_steps")
    if b is None and k is None:
        if B is None:
            raise ValueError("from_deepspeed: give train_batch_size or "
                             "train_micro_batch_size_per_gpu (DeepSpeed needs one)")
        k = 1
    if b is None:
        b, rest = divmod(B, k * world_size)
    elif k is None:
        k, rest = divmod(B, b * world_size) if B is not None else (1, 0)
    else:
        rest = 0
    if rest or (B is not None and B != b * k * world_size):
        raise ValueError(f"from_deepspeed: train_batch_size={B} must equal "
                         f"train_micro_batch_size_per_gpu={b} × gradient_accumulation_steps="
                         f"{k} × {world_size} ranks (DeepSpeed's batch identity); fix one of "
                         "the three")
    zero = config.get("zero_optimization") or {}
    bf16 = bool((config.get("bf16") or {}).get("enabled", False))
    fp16 = bool((config.get("fp16") or {}).get("enabled", False))
    return Layout(dp=world_size, zero_stage=int(zero.get("stage", 0)), micro_batch=int(b),
                  accumulation=int(k), recipe=MIXED_ADAM if (bf16 or fp16) else FP32_ADAM,
                  offload_optimizer=_device(zero.get("offload_optimizer")),
                  offload_params=_device(zero.get("offload_param")),
                  clip=float(config.get("gradient_clipping", 1.0)))


@dataclass(frozen=True)
class LayoutBytes:
    """Model-state bytes one rank keeps on its device and off it, and the gradient bytes it
    sends per optimizer step by the ZeRO paper's ring arithmetic (lesson 02)."""

    device: float
    host: float
    """On the CPU (or NVMe) by offloading."""
    sent_per_step: float


def layout_bytes(layout: Layout, *, num_params: float) -> LayoutBytes:
    """Bytes of `layout` for a model of Ψ = `num_params` (`LayoutBytes`): the ZeRO stage's
    model states (`memory.model_state_bytes`), the optimizer states (and, at stage 3, the
    parameters) moved off the device by offloading; per step, a ring's 2(d−1)/d·gΨ for stages
    0-2 and 3(d−1)/d·gΨ for stage 3 (Rajbhandari et al., §7: 2Ψ and 3Ψ), with g the gradient's
    bytes per element and one reduction per step (what a framework does with accumulation is
    measured in lesson 16, not assumed here)."""
    d, g = layout.dp, layout.recipe.grad_bytes
    states = model_state_bytes(num_params, d, layout.zero_stage, layout.recipe)
    host = 0.0
    if layout.offload_optimizer != "none":
        host += states.optimizer
    if layout.offload_params != "none":
        host += states.params
    ring = (d - 1) / d * g * num_params   # one reduce-scatter or all-gather of the gradient
    sent = (3 if layout.zero_stage == 3 else 2) * ring
    return LayoutBytes(device=states.total - host, host=host, sent_per_step=sent)


__all__ = ["ACCELERATE_DOC", "DEEPSPEED_DOC", "MEGATRON_DOC", "OFFLOAD_DEVICES", "SETTINGS",
           "TORCHTITAN_DOC", "Layout", "LayoutBytes", "Setting", "deepspeed_config",
           "from_deepspeed", "layout_bytes"]
