"""Planning N-D parallel runs: which dp × tp × pp (× cp) layout, ZeRO stage and micro-batch
count fits a model on a cluster, and how fast each is predicted to be.

    from toolkit import planner
    dgx = planner.cluster("dgx-a100-80gb", nodes=128)             # 1024 A100s
    table = planner.plan("gpt3-175b", dgx, global_batch=1536)     # pandas, best first
    table.head()                                                  # dp, tp, pp, memory, step, MFU
    planner.predict("gpt2-small", dgx.with_gpus(8), planner.Layout(dp=8), global_batch=64)

Pure functions over `toolkit.memory` (bytes), `toolkit.cost` (α-β links and the pipeline
bubble, `toolkit.cost.bubble`) and `toolkit.flops` (FLOPs); nothing here starts a process. The
model set against a real run on this machine is `toolkit.experiments.planner`.

==========  =====================================================================================
module      holds
==========  =====================================================================================
`cluster`   `Cluster` (GPUs per node, memory, intra/inter-node α-β, peak), presets `CLUSTERS`,
            `cluster(name, nodes=)`, `laptop(link=, peak_flops=)` for CPU ranks
`layout`    `Layout` (dp, tp, pp, cp, ZeRO stage, micro-batches, recompute, attention), the grid
            (`coords`, `groups`, `span`), `AXES`
`plan`      `predict` (one layout: memory parts, time parts, MFU, HFU; fits with
            `MEMORY_HEADROOM` free), `layouts` (enumerate), `plan` (predict all, rank),
            `as_shape`, `EFFICIENCY`
`comm`      the α-β terms both use: a micro-batch's tp/cp/pp traffic, a gradient exchange
`calibrated` the step time of a dp × tp layout rebuilt from this machine's measured rates
            (`Calibration`: a rate per kind of op at its size, the glue of a micro-batch, α-β
            per group size), `predict_calibrated`, `step_ops`, `kendall_tau`
`moe_shapes` `MoEShape` (experts, top-k, GQA; parameters, active parameters, FLOPs), presets
            `MOE_MODELS` (Mixtral 8x7B)
`experts`   the expert-parallel axis: `predict_moe` (experts sharded over ep, all-to-all time),
            `layouts_moe`, `plan_moe`
==========  =====================================================================================

    mixtral = planner.moe_shape("mixtral-8x7b")
    planner.plan_moe(mixtral, dgx.with_gpus(64), global_batch=256, seq_len=4096)  # ranked, ep
"""

from .cluster import CLUSTERS, Cluster, cluster, laptop
from .layout import AXES, EXPERT_AXES, Layout
from .plan import (
    EFFICIENCY, MEMORY_HEADROOM, Prediction, as_shape, divisors, layouts, plan, predict,
    stage_params,
)
from .calibrated import CalibratedPrediction, Calibration, kendall_tau, predict_calibrated, step_ops
from .moe_shapes import MOE_MODELS, MoEShape, moe_shape
from .experts import layouts_moe, plan_moe, predict_moe

__all__ = ["AXES", "CLUSTERS", "EFFICIENCY", "EXPERT_AXES", "MEMORY_HEADROOM", "MOE_MODELS",
           "CalibratedPrediction",
           "Calibration", "Cluster", "Layout", "MoEShape", "Prediction", "as_shape", "cluster",
           "divisors", "kendall_tau", "laptop", "layouts", "layouts_moe", "moe_shape", "plan",
           "plan_moe", "predict", "predict_calibrated", "predict_moe", "stage_params",
           "step_ops"]
