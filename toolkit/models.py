"""The tiny models that lessons, labs and tests share, and the synthetic data they train on.

`TinyMLP` (a stack of Linear layers) and `TinyGPT` (a small pre-norm decoder-only transformer)
are small enough to train in seconds on a CPU, yet have the structure the parallel algorithms of
the course need: `.layers` / `.blocks` to cut into pipeline stages, explicit q/k/v/output and
MLP projections to split across tensor-parallel ranks, and tied embedding/head weights as the
edge case that data-parallel and FSDP code must get right.

Parameters are drawn from a local `torch.Generator` seeded with ``seed``, never from the global
RNG. So every rank, and the single-process reference that checks it, builds bitwise the same
model from the same seed without broadcasting anything, and building a model in the middle of
a run does not shift the random numbers of the code around it (data shuffling, dropout).

``device=`` (models and data alike) draws on the CPU generator as above, then moves the result:
a GPU rank gets bitwise the numbers a CPU reference gets (a CUDA generator draws others), as
Megatron-LM's CPU initialisation does. In a rank, pass ``device=toolkit.launch.device()``.

    model = TinyGPT(GPTConfig(n_layer=4))
    x, y = make_token_data(32, seq_len=16, vocab_size=64)
    logits, loss = model(x, y)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .arguments import check_int, check_ints

__all__ = [
    "GPTConfig", "TinyGPT", "TinyMLP", "count_parameters", "course_loss", "gpt_param_count",
    "make_regression_data", "make_token_data",
]

Attend = Callable[[Tensor, Tensor, Tensor], Tensor]
"""An attention core: (q, k, v), each (b, nh, s, hd) -> (b, nh, s, hd)."""


DeviceLike = torch.device | str | None


def _moved(t: Tensor, device: DeviceLike) -> Tensor:
    """`t` on `device` (None: where it is)."""
    return t if device is None else t.to(device)


class TinyMLP(nn.Module):
    """``depth`` hidden Linear+ReLU layers of width ``d_hidden``, then a Linear to ``d_out``;
    built on ``device`` (the same values on every device, see the module docstring)."""

    def __init__(
        self, d_in: int = 8, d_hidden: int = 32, d_out: int = 4, depth: int = 2, seed: int = 0,
        *, device: DeviceLike = None,
    ) -> None:
        super().__init__()
        check_ints("TinyMLP", d_in=d_in, d_hidden=d_hidden, d_out=d_out)
        check_int("TinyMLP", "depth", depth, low=0)
        widths = [d_in] + [d_hidden] * depth + [d_out]
        mods: list[nn.Module] = []
        # Built on the meta device, so PyTorch's default init (which draws from the global RNG)
        # draws nothing; to_empty then gives real, uninitialised CPU storage that we fill below.
        with torch.device("meta"):
            for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
                mods.append(nn.Linear(a, b))
                if i < depth:
                    mods.append(nn.ReLU())
        # Flat (Linear, ReLU, ..., Linear) so pipeline code can slice it: `model.layers[:2]`.
        self.layers = nn.Sequential(*mods).to_empty(device="cpu")
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for lin in self.layers:
                if isinstance(lin, nn.Linear):
                    # PyTorch's own default for Linear (uniform in +-1/sqrt(fan_in)), seeded.
                    bound = 1.0 / math.sqrt(lin.in_features)
                    lin.weight.uniform_(-bound, bound, generator=gen)
                    lin.bias.uniform_(-bound, bound, generator=gen)
        if device is not None:
            self.to(device)

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)  # (b, d_in) -> (b, d_out)


@dataclass(frozen=True)
class GPTConfig:
    """Sizes of a `TinyGPT`; validated on construction (use `dataclasses.replace` to vary)."""

    vocab_size: int = 64
    """Number of distinct tokens."""
    seq_len: int = 16
    """Longest sequence the model accepts (rows of the position embedding)."""
    d_model: int = 32
    """Width of the residual stream, ``h`` in the shape comments."""
    n_head: int = 4
    """Attention heads per layer; must divide ``d_model``."""
    n_layer: int = 2
    """Number of transformer blocks."""
    d_ff: int | None = None
    """Hidden width of each block's MLP; None means ``4 * d_model`` (see `ff_dim`)."""
    dropout: float = 0.0
    """Dropout probability on embeddings, attention weights and residual branches."""
    tie_weights: bool = True
    """Share one matrix between the token embedding and the lm_head."""
    seed: int = 0
    """Seed of the local generator that initialises the parameters."""

    def __post_init__(self) -> None:
        check_ints(
            "GPTConfig", vocab_size=self.vocab_size, seq_len=self.seq_len,
            d_model=self.d_model, n_head=self.n_head, n_layer=self.n_layer,
        )
        if self.d_ff is not None:
            check_ints("GPTConfig", d_ff=self.d_ff)
        if self.d_model % self.n_head != 0:
            raise ValueError(
                f"GPTConfig: d_model must be divisible by n_head, "
                f"got d_model={self.d_model}, n_head={self.n_head}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig: dropout must be in [0, 1), got {self.dropout!r}")

    @property
    def ff_dim(self) -> int:
        """The MLP hidden width actually used: ``d_ff``, or ``4 * d_model`` when it is None."""
        return self.d_ff if self.d_ff is not None else 4 * self.d_model

    @property
    def head_dim(self) -> int:
        """Width of one attention head, ``d_model // n_head``."""
        return self.d_model // self.n_head


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where position i only sees positions <= i."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        h = cfg.d_model
        self.n_head, self.head_dim = cfg.n_head, cfg.head_dim
        # Separate projections, not one fused qkv: tensor parallel splits each by columns (heads)
        # and out_proj by rows, which is easiest to read off four plain Linears.
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h)
        self.out_proj = nn.Linear(h, h)
        self.attn_drop, self.resid_drop = nn.Dropout(cfg.dropout), nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, attend: Attend | None = None) -> Tensor:
        """`attend` replaces the attention core `self.attend` (same inputs and output), e.g. to
        recompute it in backward (`toolkit.recompute`'s selective recomputation)."""
        b, s, h = x.shape
        nh, hd = self.n_head, self.head_dim
        # (b, s, h) @ (h, h) -> (b, s, h) -> (b, nh, s, hd), one each for q, k, v
        q = self.q_proj(x).view(b, s, nh, hd).transpose(1, 2)
        k = self.k_proj(x).view(b, s, nh, hd).transpose(1, 2)
        v = self.v_proj(x).view(b, s, nh, hd).transpose(1, 2)
        y = (attend or self.attend)(q, k, v)  # (b, nh, s, hd)
        y = y.transpose(1, 2).reshape(b, s, h)  # (b, nh, s, hd) -> (b, s, h)
        return self.resid_drop(self.out_proj(y))  # (b, s, h) @ (h, h) -> (b, s, h)

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """The attention core, softmax(q kᵀ/√d, causal) v, with dropout on the probabilities:
        (b, nh, s, hd) three times -> (b, nh, s, hd). It keeps the (b, nh, s, s) scores for
        backward, the 5·a·s²·b term of Korthikanti et al. 2022 (toolkit.memory.activations)."""
        s = q.shape[-2]
        # (b, nh, s, hd) @ (b, nh, hd, s) -> (b, nh, s, s)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        future = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
        att = self.attn_drop(att.masked_fill(future, float("-inf")).softmax(dim=-1))
        return att @ v  # (b, nh, s, s) @ (b, nh, s, hd) -> (b, nh, s, hd)


class MLP(nn.Module):
    """Two Linear layers with a GELU between: h -> d_ff -> h."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.up_proj = nn.Linear(cfg.d_model, cfg.ff_dim)
        self.down_proj = nn.Linear(cfg.ff_dim, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        x = F.gelu(self.up_proj(x))  # (b, s, h) @ (h, d_ff) -> (b, s, d_ff)
        return self.drop(self.down_proj(x))  # (b, s, d_ff) @ (d_ff, h) -> (b, s, h)


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(cfg.d_model), CausalSelfAttention(cfg)
        self.ln_2, self.mlp = nn.LayerNorm(cfg.d_model), MLP(cfg)

    def forward(self, x: Tensor, attend: Attend | None = None) -> Tensor:
        # attend: see CausalSelfAttention.forward. Passed only when given, so that a block whose
        # attn was swapped for another module (a tensor-parallel one) still runs.
        y = self.ln_1(x)
        x = x + (self.attn(y) if attend is None else self.attn(y, attend))
        return x + self.mlp(self.ln_2(x))


class TinyGPT(nn.Module):
    """A small GPT-2-style language model; ``forward(idx, targets)`` -> ``(logits, loss)``;
    built on ``device`` (the same values on every device, see the module docstring)."""

    def __init__(self, cfg: GPTConfig | None = None, *, device: DeviceLike = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg if cfg is not None else GPTConfig()
        with torch.device("meta"):  # see TinyMLP: keeps the global RNG untouched
            self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
            self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
            self.drop = nn.Dropout(cfg.dropout)
            self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
            self.ln_f = nn.LayerNorm(cfg.d_model)
            self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.to_empty(device="cpu")
        if cfg.tie_weights:
            # Tie after materialising: moving off meta would give each module its own copy.
            self.lm_head.weight = self.tok_emb.weight
        gen = torch.Generator().manual_seed(cfg.seed)
        # GPT-2's init; residual-branch outputs are scaled down so the stream's variance does
        # not grow with depth.
        resid_std = 0.02 / math.sqrt(2 * cfg.n_layer)
        with torch.no_grad():
            # named_parameters() yields a tied weight once, so it is initialised once.
            for name, p in self.named_parameters():
                if isinstance(self.get_submodule(name.rsplit(".", 1)[0]), nn.LayerNorm):
                    p.fill_(1.0 if name.endswith("weight") else 0.0)
                elif name.endswith("bias"):
                    p.zero_()
                else:
                    resid = name.endswith(("out_proj.weight", "down_proj.weight"))
                    p.normal_(0.0, resid_std if resid else 0.02, generator=gen)
        if device is not None:
            self.to(device)
            if cfg.tie_weights:  # a move to another kind of tensor (meta) makes new parameters
                self.lm_head.weight = self.tok_emb.weight

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        b, s = idx.shape
        if s > self.cfg.seq_len:
            raise ValueError(f"TinyGPT: sequence length {s} exceeds cfg.seq_len={self.cfg.seq_len}")
        pos = torch.arange(s, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))  # (b, s, h) + (s, h) -> (b, s, h)
        for block in self.blocks:
            x = block(x)  # (b, s, h) -> (b, s, h)
        logits = self.lm_head(self.ln_f(x))  # (b, s, h) @ (h, V) -> (b, s, V)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.reshape(b * s, -1), targets.reshape(b * s))
        return logits, loss


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of scalar parameters; a tensor shared by several modules (tied) counts once."""
    # parameters() already deduplicates by identity, which is what makes tied weights count once.
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def gpt_param_count(cfg: GPTConfig) -> int:
    """`TinyGPT(cfg)`'s parameter count, from the formula rather than by building it."""
    h, f = cfg.d_model, cfg.ff_dim
    embeddings = cfg.vocab_size * h + cfg.seq_len * h
    attention = 4 * h * h + 4 * h  # q, k, v, out: (h, h) weight + h bias each
    mlp = 2 * h * f + f + h  # up (h, f) + f bias, down (f, h) + h bias
    layer_norms = 4 * h  # ln_1 and ln_2, weight and bias each
    head = 0 if cfg.tie_weights else cfg.vocab_size * h
    return embeddings + cfg.n_layer * (attention + mlp + layer_norms) + 2 * h + head


def make_regression_data(n: int, d_in: int, d_out: int, *, seed: int = 0,
                         device: DeviceLike = None) -> tuple[Tensor, Tensor]:
    """``(x, y)`` of shapes ``(n, d_in)``, ``(n, d_out)``: a fixed random linear map plus noise,
    on ``device`` (drawn on the CPU: the same values everywhere).

    A `TinyMLP(d_in=d_in, d_out=d_out)` can fit it, so losses visibly fall in a lesson.
    """
    check_ints("make_regression_data", n=n, d_in=d_in, d_out=d_out)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d_in, generator=gen)
    w = torch.randn(d_in, d_out, generator=gen) / math.sqrt(d_in)
    # (n, d_in) @ (d_in, d_out) -> (n, d_out)
    y = x @ w + 0.01 * torch.randn(n, d_out, generator=gen)
    return _moved(x, device), _moved(y, device)


def make_token_data(
    n: int, seq_len: int, vocab_size: int, *, seed: int = 0, device: DeviceLike = None
) -> tuple[Tensor, Tensor]:
    """``(inputs, targets)``, both ``(n, seq_len)`` int64, with ``targets[:, t] == inputs[:, t+1]``,
    on ``device`` (drawn on the CPU: the same values everywhere).

    Each sequence starts at a random token and then follows one fixed random permutation of the
    vocabulary, so the next token is a function of the current one: a model can learn it and the
    loss falls well below ``log(vocab_size)`` (uniform random tokens leave nothing to learn).
    """
    check_ints("make_token_data", n=n, seq_len=seq_len, vocab_size=vocab_size)
    gen = torch.Generator().manual_seed(seed)
    successor = torch.randperm(vocab_size, generator=gen)
    seq = torch.empty(n, seq_len + 1, dtype=torch.long)
    seq[:, 0] = torch.randint(vocab_size, (n,), generator=gen)
    for t in range(seq_len):
        seq[:, t + 1] = successor[seq[:, t]]
    return _moved(seq[:, :-1].clone(), device), _moved(seq[:, 1:].clone(), device)


def course_loss(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    """The course's training loss: TinyGPT's own cross-entropy over next tokens (x, y: (b, s)),
    else the mean squared error of ``model(x)`` against ``y`` (TinyMLP: (b, d_out)). `model`
    may be a wrapper with ``.module`` (the course's DDP and FSDP, torch's DDP, DeepSpeed's
    engine): it is called, and the wrapped model decides which loss."""
    if isinstance(getattr(model, "module", model), TinyGPT):
        return model(x, y)[1]
    return F.mse_loss(model(x), y)
