"""What collectives cost: α-β models, fitting α and β to measurements, nccl-tests bandwidths.

    from toolkit import cost
    from toolkit.experiments.collectives import measure
    link = cost.AlphaBeta(alpha=100e-6, beta=1e-9)              # 100 µs per message, 1 GB/s
    cost.predict("all_reduce", "ring", 64 << 20, p=4, link=link)  # seconds
    df = measure([("all_reduce", "ring"), ("all_reduce", "torch")],
                 sizes=[4096, 1 << 20], world_sizes=[2, 4])       # real ranks
    cost.fit_alpha_beta(df[df.algorithm == "ring"]).link          # α, β of this machine

Models and fits are pure functions (numbers in, numbers out); nothing here starts a process.
`models` holds the formulas and their sources, `choose` which algorithm they pick, `fit` the
least squares, `results` the folder format for saved sweeps. The sweep on real ranks lives in
`toolkit.experiments.collectives`.
"""

from .choose import fastest, human_bytes, switch_points
from .fit import Fit, Sample, fit_alpha_beta, relative_errors
from .models import (
    BUS_FACTOR, COEFFICIENTS, TORCH, AlphaBeta, algbw, busbw, bytes_sent_per_rank, coefficients,
    crossover_bytes, predict,
)

__all__ = [
    "BUS_FACTOR", "COEFFICIENTS", "TORCH", "AlphaBeta", "Fit", "Sample", "algbw", "busbw",
    "bytes_sent_per_rank", "coefficients", "crossover_bytes", "fastest", "fit_alpha_beta",
    "human_bytes", "predict", "relative_errors", "switch_points",
]
