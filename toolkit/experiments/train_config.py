"""What the framework comparisons of lesson 16 train: one model, data set, batch size and
learning rate for every run (PyTorch Lightning's in `toolkit.experiments.frameworks`, DeepSpeed's
and Accelerate's in `toolkit.experiments.framework_runs`). Lightning-free, so that the second
pays no Lightning import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch
from torch.utils.data import DataLoader, TensorDataset

from ..arguments import check_int, check_positive
from ..models import GPTConfig, TinyGPT, TinyMLP, make_regression_data, make_token_data

__all__ = ["TrainConfig", "max_param_diff"]


@dataclass(frozen=True)
class TrainConfig:
    """What every run trains: the same model, data, batches and optimizer."""

    model: str = "gpt"
    """``"gpt"`` (TinyGPT on `make_token_data`) or ``"mlp"`` (TinyMLP on regression data)."""
    gpt: GPTConfig = GPTConfig()
    """The TinyGPT's sizes (its ``seed`` initialises every rank alike)."""
    samples: int = 64
    """Samples in the data set; each epoch deals them out over the ranks."""
    batch_size: int = 8
    """Samples per rank per step."""
    epochs: int = 2
    lr: float = 0.5
    """Plain SGD's learning rate."""

    def __post_init__(self) -> None:
        if self.model not in ("gpt", "mlp"):
            raise ValueError(f"TrainConfig: model must be 'gpt' or 'mlp', got {self.model!r}")
        for name in ("samples", "batch_size", "epochs"):
            check_int("TrainConfig", name, getattr(self, name))
        check_positive("TrainConfig", "lr", self.lr)

    def build_model(self, device: torch.device | None = None) -> torch.nn.Module:
        """The model every run starts from, the same on every rank, on `device`."""
        if self.model == "gpt":
            return TinyGPT(self.gpt, device=device)
        return TinyMLP(seed=0, device=device)

    def dataset(self) -> TensorDataset:
        """(index, x, y) for every sample, on the CPU, the same on every rank."""
        if self.model == "gpt":
            x, y = make_token_data(self.samples, self.gpt.seq_len, self.gpt.vocab_size)
        else:
            x, y = make_regression_data(self.samples, 8, 4)
        return TensorDataset(torch.arange(self.samples, device=x.device), x, y)

    def loader(self) -> DataLoader:
        """The DataLoader a Lightning user writes: no sampler, no shuffle (Lightning adds both)."""
        return DataLoader(self.dataset(), batch_size=self.batch_size)


def max_param_diff(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor], *,
                   names: tuple[str, str] = ("a", "b")) -> float:
    """Largest |difference| between two runs' parameters, name by name (`names`: the runs, for
    the error when they name their parameters differently)."""
    if a.keys() != b.keys():
        raise ValueError(f"max_param_diff: {names[0]} and {names[1]} name their parameters "
                         f"differently: {sorted(a.keys() ^ b.keys())}")
    return max((a[k] - b[k]).abs().max().item() for k in a)
