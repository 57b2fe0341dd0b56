"""What collectives cost: α-β models, fitting α and β to measurements, nccl-tests bandwidths.

    from toolkit import cost
    link = cost.AlphaBeta(alpha=100e-6, beta=1e-9)              # 100 µs per message, 1 GB/s
    cost.predict("all_reduce", "ring", 64 << 20, p=4, link=link)  # seconds
    from toolkit.experiments.collectives import measure
    df = measure([("all_reduce", "sliced_ring"), ("all_reduce", "torch")],
                 sizes=[4096, 1 << 20], world_sizes=[2, 4])  # real ranks, alternating trials
    cost.fit_alpha_beta(df[df.algorithm == "sliced_ring"]).link   # α, β of this machine
    cost.fit_piecewise(cost.as_model(df[df.p == 2], "sliced_ring"))  # α, β per size regime

Models and fits are pure functions (numbers in, numbers out); nothing here starts a process.
`models` holds the formulas and their sources, `choose` which algorithm they pick, `fit` the
least squares, `piecewise` one α-β per size regime, `slicing` the adds the α-β model leaves out
(why a sliced ring is faster), `spread` medians and spreads of repeated timings, `results` the
folder format for saved sweeps. The sweep on real ranks lives in `toolkit.experiments.collectives`.
"""

from .choose import fastest, human_bytes, switch_points
from .fit import Fit, Sample, fit_alpha_beta, relative_errors
from .models import (
    BUS_FACTOR, COEFFICIENTS, TORCH, AlphaBeta, algbw, busbw, bytes_sent_per_rank, coefficients,
    crossover_bytes, predict,
)
from .piecewise import PiecewiseFit, PiecewiseModel, Regime, as_model, errors_at, fit_piecewise
from .slicing import best_slices, sliced_ring_time, slicing_speedup
from .spread import Spread, agree, paired_ratios, spread

__all__ = [
    "BUS_FACTOR", "COEFFICIENTS", "TORCH", "AlphaBeta", "Fit", "PiecewiseFit", "PiecewiseModel",
    "Regime", "Sample", "Spread", "agree", "algbw", "as_model", "best_slices", "busbw",
    "bytes_sent_per_rank", "coefficients", "crossover_bytes", "errors_at", "fastest",
    "fit_alpha_beta", "fit_piecewise", "human_bytes", "paired_ratios", "predict",
    "relative_errors", "sliced_ring_time", "slicing_speedup", "spread", "switch_points",
]
