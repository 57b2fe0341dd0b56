"""A training step of TinyGPT counted and timed, beside the FLOPs formula of `toolkit.flops`.

The formula (Kaplan et al. 2020, section 2.1; PaLM, Chowdhery et al. 2022, appendix B): a step
costs 6·N + 12·L·h·s FLOPs per token; full recomputation (Korthikanti et al. 2022, section 6)
adds a forward's 2·N + 4·L·h·s of hardware work. `measure_step` runs one step of a real model,
optionally checkpointed in segments (`toolkit.recompute.CheckpointedGPT`), counts its matmuls
with `FlopCounterMode` and times it: the model FLOPs per second are MFU's numerator. Inputs:
token ids ``idx`` and ``targets`` of shape (batch, seq_len).
"""

from __future__ import annotations

from torch import Tensor

from ..flops import count_flops, step_flops, timed
from ..models import TinyGPT
from ..recompute import CheckpointedGPT


def measure_step(model: TinyGPT, idx: Tensor, targets: Tensor, *, every: int | None = None,
                 repeats: int = 3) -> dict[str, float]:
    """One training step (forward + backward) of `model`, counted and timed.

    ``every``: checkpoint segments of that many blocks (`toolkit.recompute.CheckpointedGPT`),
    None for none. Returns ``model_flops`` (the formula, `step_flops`), ``counted_flops``
    (FlopCounterMode: what ran, recomputation included), ``seconds`` (best of `repeats`) and
    ``flops_per_s`` (model FLOPs per second: the numerator of MFU).
    """
    step_model = CheckpointedGPT(model, every=every)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        _, loss = step_model(idx, targets)
        loss.backward()

    counted = count_flops(step)
    seconds = timed(step, repeats=repeats)
    model.zero_grad(set_to_none=True)
    analytic = step_flops(model.cfg, idx.shape[0], seq_len=idx.shape[1])["model"]
    return {"model_flops": analytic, "counted_flops": float(counted), "seconds": seconds,
            "flops_per_s": analytic / seconds}


__all__ = ["measure_step"]
