"""Mixture-of-experts model shapes for the planner: parameters, active parameters, FLOPs.

A decoder layer of an MoE transformer keeps attention and its norms, and replaces the MLP by a
router (h·E weights) and E experts of f hidden units (Switch Transformers, Fedus et al., 2022,
§2; Mixtral, Jiang et al., 2024, §2). Counted here, with no biases (Mixtral has none, and at
h = 4096 biases are 0.01 % of a layer):

    attention      2h² + 2·h·(kv·h/a)       q and output projections, k and v for kv of the a
                                            heads (grouped-query attention; kv = a: 4h²)
    norms          2h                       two RMSNorm weights (LayerNorm would add 2h biases)
    router         h·E
    one expert     m·h·f                    m = 3 for SwiGLU (gate, up, down: Mixtral), 2 for
                                            a GELU MLP (Switch, GShard)
    MoE layer      attention + norms + router + E·m·h·f
    dense layer    attention + norms + m·h·f_dense   (models with MoE every other layer)
    model          layers + V·h embedding + V·h head (untied) + h final norm (+ s·h learned
                   positions)

Active parameters (those one token's forward touches) count k experts instead of E. Training
FLOPs per token, as `toolkit.flops` counts them: 6·N_active (Kaplan et al., 2020, §2.1: 2N
forward, 4N backward) + 12·L·h·s (PaLM, Chowdhery et al., 2022, appendix B: attention's two
s-long products, q·kᵀ and the weighted sum of v; Kaplan's Table 1 has a single context-dependent
term, the size of one of them: 6·L·h·s for a step), N_active counting the matrices a token
multiplies (the embedding lookup excluded, the head included). A padded buffer computes cf·k
expert rows per token instead of k (hardware FLOPs, not model FLOPs).

Published shape: Mixtral 8x7B (Jiang et al., 2024, "Mixtral of Experts", arXiv:2401.04088,
Table 1: dim 4096, 32 layers, head_dim 128, hidden_dim 14336, 32 heads, 8 kv heads, context
32768, vocab 32000, 8 experts, top 2; abstract and §1: "47B parameters, ... 13B active").
The formula above gives 46.70B and 12.88B (Mistral AI's release note says 46.7B and 12.9B).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..arguments import check_int, check_ints

__all__ = ["MOE_MODELS", "MoEShape", "moe_shape"]


@dataclass(frozen=True)
class MoEShape:
    """A decoder-only MoE transformer (module docstring for the counts)."""

    name: str
    """Label, the key in `MOE_MODELS`."""
    layers: int
    """Transformer layers L."""
    hidden: int
    """Hidden size h."""
    heads: int
    """Attention (query) heads a."""
    vocab: int
    """Vocabulary V."""
    seq_len: int
    """Training sequence length s."""
    num_experts: int
    """E: experts per MoE layer."""
    top_k: int
    """k: experts each token runs."""
    expert_ffn: int
    """f: hidden units of one expert."""
    kv_heads: int = 0
    """Key/value heads (grouped-query attention); 0 means as many as `heads`."""
    gated: bool = True
    """SwiGLU experts (3 matrices, Mixtral) or GELU MLPs (2 matrices, Switch/GShard)."""
    moe_every: int = 1
    """Every n-th layer is an MoE layer (1: all, Mixtral; 2: every other, Switch, GShard)."""
    dense_ffn: int = 0
    """Hidden units of the dense layers' MLP (0: 4h); unused when moe_every = 1."""
    tied: bool = False
    """Output layer shares the embedding's matrix."""
    learned_positions: bool = False
    """A learned s × h position embedding (GPT-2); False for rotary positions (Mixtral)."""
    published: float = 0.0
    """Total parameters as published (0: none)."""
    published_active: float = 0.0
    """Active parameters per token as published (0: none)."""

    def __post_init__(self) -> None:
        check_ints("MoEShape", layers=self.layers, hidden=self.hidden, heads=self.heads,
                   vocab=self.vocab, seq_len=self.seq_len, num_experts=self.num_experts,
                   expert_ffn=self.expert_ffn, moe_every=self.moe_every)
        check_int("MoEShape", "top_k", self.top_k, high=self.num_experts)
        check_int("MoEShape", "kv_heads", self.kv_heads, low=0, high=self.heads)
        check_int("MoEShape", "dense_ffn", self.dense_ffn, low=0)
        if self.hidden % self.heads or (self.kv_heads and self.heads % self.kv_heads):
            raise ValueError(f"MoEShape: heads={self.heads} must divide hidden={self.hidden}, "
                             f"and kv_heads={self.kv_heads} must divide heads")

    @property
    def matrices(self) -> int:
        """m: weight matrices per expert (3 gated, 2 not)."""
        return 3 if self.gated else 2

    @property
    def moe_layers(self) -> int:
        """Layers with experts: L // moe_every."""
        return self.layers // self.moe_every

    @property
    def attention_params(self) -> int:
        h = self.hidden
        kv = self.kv_heads or self.heads
        return 2 * h * h + 2 * h * (kv * h // self.heads)

    @property
    def expert_params(self) -> int:
        """m·h·f: one expert of one layer."""
        return self.matrices * self.hidden * self.expert_ffn

    @property
    def dense_ffn_params(self) -> int:
        """m·h·f_dense: the MLP of a dense layer (f_dense = 4h unless given)."""
        return self.matrices * self.hidden * (self.dense_ffn or 4 * self.hidden)

    def layer_params(self, *, moe: bool, experts: int | None = None) -> int:
        """Parameters of one layer; `experts`: how many experts to count (default all E)."""
        base = self.attention_params + 2 * self.hidden
        if not moe:
            return base + self.dense_ffn_params
        n = self.num_experts if experts is None else experts
        return base + self.hidden * self.num_experts + n * self.expert_params

    @property
    def outside_layers(self) -> int:
        """Embedding, head, final norm (and learned positions)."""
        v_h = self.vocab * self.hidden
        return (v_h + (0 if self.tied else v_h) + self.hidden
                + (self.seq_len * self.hidden if self.learned_positions else 0))

    def _total(self, experts: int | None) -> int:
        dense = self.layers - self.moe_layers
        return (dense * self.layer_params(moe=False)
                + self.moe_layers * self.layer_params(moe=True, experts=experts)
                + self.outside_layers)

    @property
    def num_params(self) -> int:
        """Every parameter."""
        return self._total(None)

    @property
    def active_params(self) -> int:
        """Parameters one token uses: k experts per MoE layer."""
        return self._total(self.top_k)

    @property
    def expert_params_total(self) -> int:
        """Parameters in experts: moe_layers · E · m·h·f."""
        return self.moe_layers * self.num_experts * self.expert_params

    def matmul_params(self, *, capacity_factor: float = 1.0) -> float:
        """N_active of the FLOP count: the matrices a token multiplies (head included,
        embedding lookup and norms not), the experts counted cf·k times."""
        dense = self.layers - self.moe_layers
        moe_layer = (self.attention_params + self.hidden * self.num_experts
                     + capacity_factor * self.top_k * self.expert_params)
        return (dense * (self.attention_params + self.dense_ffn_params)
                + self.moe_layers * moe_layer + self.vocab * self.hidden)

    def flops_per_token(self, *, seq_len: int | None = None,
                        capacity_factor: float = 1.0) -> float:
        """Training FLOPs per token: 6·N_active + 12·L·h·s (cf > 1: padded expert rows)."""
        s = self.seq_len if seq_len is None else seq_len
        return (6 * self.matmul_params(capacity_factor=capacity_factor)
                + 12 * self.layers * self.hidden * s)


MOE_MODELS: dict[str, MoEShape] = {m.name: m for m in (
    MoEShape("mixtral-8x7b", layers=32, hidden=4096, heads=32, kv_heads=8, vocab=32000,
             seq_len=32768, num_experts=8, top_k=2, expert_ffn=14336, gated=True,
             published=47e9, published_active=13e9),
)}
"""Published MoE shapes (Mixtral 8x7B: Table 1 and §1 of Jiang et al. 2024)."""


def moe_shape(name: str) -> MoEShape:
    """The shape called `name` (a key of `MOE_MODELS`)."""
    try:
        return MOE_MODELS[name]
    except KeyError:
        raise ValueError(f"moe_shape: unknown MoE model {name!r}; known: "
                         f"{sorted(MOE_MODELS)}") from None
