"""The course's tiny models with activation checkpointing: segments of blocks (Chen et al.
2016), the attention core alone (Korthikanti et al. 2022, §5: selective recomputation), or an
attention kernel that keeps no scores (FlashAttention-style).

Gradients are unchanged in every mode: a recomputed forward is the same arithmetic
(`torch.utils.checkpoint` replays the RNG state, so dropout draws the same masks); the
flash-style kernel (`F.scaled_dot_product_attention`) computes the same softmax in another
order, equal up to float rounding.

    CheckpointedGPT(TinyGPT(GPTConfig(n_layer=16)), every=4)   # 4 segments of 4 blocks
    CheckpointedGPT(model, every=None, selective=True)         # rerun q·kᵀ, softmax, ·v only
    CheckpointedMLP(TinyMLP(depth=15), every=4)                 # a chain of Linear+ReLU blocks
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ..memory import ATTENTION
from ..models import Attend, TinyGPT, TinyMLP
from ..memory.checkpointing import segment_sizes

__all__ = ["CheckpointedGPT", "CheckpointedMLP"]


class _Segmented(nn.Module):
    """Runs `blocks` in checkpointed segments of `every` (None: plainly)."""

    def __init__(self, blocks: list[nn.Module], every: int | None) -> None:
        super().__init__()
        self.every = every
        self.segments = segment_sizes(len(blocks), every)
        self._blocks = blocks  # the wrapped model's modules, registered there (not copied)

    def _run(self, block: nn.Module, x: Tensor) -> Tensor:
        return block(x)

    def segment(self, start: int, stop: int) -> Callable[[Tensor], Tensor]:
        """Blocks start..stop-1 as one function of their input."""
        def run(x: Tensor) -> Tensor:
            for block in self._blocks[start:stop]:
                x = self._run(block, x)
            return x
        return run

    def run_blocks(self, x: Tensor) -> Tensor:
        """Every block, in checkpointed segments when `every` is set."""
        if self.every is None:
            return self.segment(0, len(self._blocks))(x)
        start = 0
        for n in self.segments:
            # Non-reentrant checkpoint (PyTorch's recommended form): keeps x, drops the rest,
            # reruns the segment inside backward.
            x = checkpoint(self.segment(start, start + n), x, use_reentrant=False)
            start += n
        return x


class CheckpointedGPT(_Segmented):
    """`TinyGPT` whose blocks run in checkpointed segments of ``every`` blocks.

    ``selective=True`` reruns only each block's attention core in backward (Korthikanti et al.
    2022, §5); ``attention="flash"`` runs the core as `F.scaled_dot_product_attention`, which
    keeps no (s, s) scores. The same parameters as ``module`` (not copies) and the same forward;
    only what autograd keeps changes.
    """

    def __init__(self, module: TinyGPT, *, every: int | None = 1, selective: bool = False,
                 attention: str = "materialised") -> None:
        if not isinstance(module, TinyGPT):
            raise TypeError(f"CheckpointedGPT wraps a TinyGPT, got {type(module).__name__}")
        if attention not in ATTENTION:
            raise ValueError(f"CheckpointedGPT: attention must be one of {ATTENTION}, "
                             f"got {attention!r}")
        if selective and attention == "flash":
            raise ValueError("CheckpointedGPT: selective=True reruns the materialised attention "
                             "core; a flash-style kernel keeps no scores to save (choose one)")
        super().__init__(list(module.blocks), every)
        self.module, self.selective, self.attention = module, selective, attention

    def _run(self, block: nn.Module, x: Tensor) -> Tensor:
        return block(x, self._attend(block.attn))  # (b, s, h) -> (b, s, h)

    def _attend(self, attn: nn.Module) -> Attend | None:
        if self.selective:
            def rerun(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
                return checkpoint(attn.attend, q, k, v, use_reentrant=False)
            return rerun
        if self.attention == "flash":
            def flash(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
                p = attn.attn_drop.p if self.training else 0.0
                return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
            return flash
        return None

    def block_input(self, inputs: Tensor) -> Tensor:
        """Zeros shaped like a block's input for these token ids: (b, s, h)."""
        return torch.zeros(*inputs.shape, self.module.cfg.d_model, device=inputs.device)

    def forward(self, idx: Tensor, targets: Tensor | None = None
                ) -> tuple[Tensor, Tensor | None]:
        m = self.module
        b, s = idx.shape
        if s > m.cfg.seq_len:
            raise ValueError(f"CheckpointedGPT: sequence length {s} exceeds cfg.seq_len="
                             f"{m.cfg.seq_len}")
        x = m.drop(m.tok_emb(idx) + m.pos_emb(torch.arange(s, device=idx.device)))
        x = self.run_blocks(x)
        logits = m.lm_head(m.ln_f(x))  # (b, s, h) @ (h, V) -> (b, s, V)
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.reshape(b * s, -1), targets.reshape(b * s))


class CheckpointedMLP(_Segmented):
    """`TinyMLP` as a chain of ``depth`` blocks, each a Linear and its ReLU (the output Linear
    joins the last block), run in checkpointed segments of ``every`` blocks; the loss is the
    mean squared error.

    A block keeps one (b, d_hidden) activation for its backward (its ReLU's output, which the
    next Linear keeps too: one storage) and takes one as input, so a = c: Chen et al.'s own
    setting, where the best segment is √L blocks.
    """

    def __init__(self, module: TinyMLP, *, every: int | None = 1) -> None:
        if not isinstance(module, TinyMLP):
            raise TypeError(f"CheckpointedMLP wraps a TinyMLP, got {type(module).__name__}")
        layers = list(module.layers)  # Linear, ReLU, ..., Linear, ReLU, Linear
        if len(layers) < 3:
            raise ValueError("CheckpointedMLP: the TinyMLP needs depth >= 1 (a hidden layer)")
        blocks = [nn.Sequential(*layers[i:i + 2]) for i in range(0, len(layers) - 3, 2)]
        blocks.append(nn.Sequential(*layers[-3:]))  # the last block ends with the output Linear
        super().__init__(blocks, every)
        self.module = module

    def block_input(self, inputs: Tensor) -> Tensor:
        """Zeros shaped like the first block's input: the model's input."""
        return torch.zeros_like(inputs)

    def forward(self, x: Tensor, targets: Tensor | None = None
                ) -> tuple[Tensor, Tensor | None]:
        out = self.run_blocks(x)  # (b, d_in) -> (b, d_out)
        return out, None if targets is None else F.mse_loss(out, targets)
