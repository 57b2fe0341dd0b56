"""Memory of training: model states per ZeRO stage and precision, activations, a whole budget.

    from toolkit import memory
    memory.model_state_bytes(7.5e9, n_d=64, stage=1).total / memory.GB   # 31.4 (ZeRO Fig. 1)
    memory.activation_bytes_per_layer(seq_len=1024, batch=1, hidden=1600, heads=25)
    memory.budget("gpt2-xl", n_d=8, stage=2, batch=4).fits                 # on an 80 GiB GPU
    memory.held_model_states(model, optimizer)                             # measured on a rank

Pure functions, numbers in and numbers out (`states`, `activations`, `shapes`, `budget`);
`measured` counts the bytes a live process holds, to check the formulas against real runs
(`toolkit.experiments.memory` trains on real ranks and sets the two side by side).
Sources: ZeRO (Rajbhandari et al., SC 2020) for model states, Korthikanti et al. (2022) for
activations; see each module.
"""

from .activations import ATTENTION, RECOMPUTE, activation_bytes, activation_bytes_per_layer
from .budget import Budget, budget, states_budget
from .checkpointing import best_every, chen_memory, segment_sizes
from .measured import Held, held_model_states, storage_bytes
from .shapes import MODELS, ModelShape, model_shape
from .states import (
    FP32_ADAM, GB, MIXED_ADAM, RECIPES, SGD, SGD_MOMENTUM, STAGES, GiB, ModelStates, Recipe,
    model_state_bytes, shard_numel,
)

__all__ = [
    "ATTENTION", "FP32_ADAM", "GB", "MIXED_ADAM", "MODELS", "RECIPES", "RECOMPUTE", "SGD",
    "SGD_MOMENTUM", "STAGES", "Budget", "GiB", "Held", "ModelShape", "ModelStates", "Recipe",
    "activation_bytes", "activation_bytes_per_layer", "best_every", "budget", "chen_memory",
    "held_model_states", "model_shape", "model_state_bytes", "segment_sizes", "shard_numel",
    "states_budget", "storage_bytes",
]
