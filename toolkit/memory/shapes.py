"""Published model shapes, and their parameter counts computed from the shape.

A GPT-2-style decoder layer holds 12h² + 13h parameters: q, k, v and output projections
(4h² + 4h), an MLP h → 4h → h (8h² + 5h) and two layer norms (4h). The model adds token and
position embeddings (V·h + s·h), a final layer norm (2h) and, untied, an output layer (V·h).
Kaplan et al. (2020) approximate this by 12·L·h²; the exact count is kept here.

Sources: GPT-2 (Radford et al. 2019; sizes as released, 124M/355M/774M/1.56B counted with tied
embeddings, the paper's Table 2 rounds them to 117M/345M/762M/1542M), BERT-Large (Devlin et al.
2019, "340M"), GPT-3 175B (Brown et al. 2020, Table 2.1), and the 7.5B model of the ZeRO paper's
Figure 1, for which the paper gives only Ψ = 7.5B: the shape here (36 layers, h = 4096) is ours,
chosen to land on it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    """The shape of a transformer, enough to count parameters and activations."""

    name: str
    """Label, the key in `MODELS`."""
    layers: int
    """Transformer layers L."""
    hidden: int
    """Hidden size h."""
    heads: int
    """Attention heads a."""
    vocab: int
    """Vocabulary size V."""
    seq_len: int
    """Sequence length s used in training (and rows of the position embedding)."""
    published: float
    """The parameter count the authors published, for comparison."""
    tied: bool = True
    """Output layer shares the token embedding's matrix (no extra V·h)."""
    extra: int = 0
    """Parameters outside the decoder formula (BERT: token-type embeddings, pooler)."""

    @property
    def num_params(self) -> int:
        """Parameters counted from the shape (module docstring)."""
        h, L = self.hidden, self.layers
        per_layer = 12 * h * h + 13 * h
        embeddings = self.vocab * h + self.seq_len * h
        head = 0 if self.tied else self.vocab * h
        return embeddings + L * per_layer + 2 * h + head + self.extra

    @property
    def relative_error(self) -> float:
        """(counted − published) / published."""
        return (self.num_params - self.published) / self.published


def _bert_extra(h: int) -> int:
    # Two token-type embeddings (2h) and the pooler (h² + h); BERT's embedding layer norm (2h)
    # stands where a GPT has its final layer norm, so the 2h of the formula covers it.
    return 2 * h + h * h + h


MODELS: dict[str, ModelShape] = {m.name: m for m in (
    ModelShape("gpt2-small", 12, 768, 12, 50257, 1024, 124e6),
    ModelShape("gpt2-medium", 24, 1024, 16, 50257, 1024, 355e6),
    ModelShape("gpt2-large", 36, 1280, 20, 50257, 1024, 774e6),
    ModelShape("gpt2-xl", 48, 1600, 25, 50257, 1024, 1.5e9),
    ModelShape("bert-large", 24, 1024, 16, 30522, 512, 340e6, extra=_bert_extra(1024)),
    ModelShape("zero-7.5b", 36, 4096, 32, 50257, 1024, 7.5e9),
    ModelShape("gpt3-175b", 96, 12288, 96, 50257, 2048, 175e9),
)}
"""Published shapes by name."""


def model_shape(name: str) -> ModelShape:
    """The shape called `name` (a key of `MODELS`)."""
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"model_shape: unknown model {name!r}; known: {sorted(MODELS)}") from None


__all__ = ["MODELS", "ModelShape", "model_shape"]
