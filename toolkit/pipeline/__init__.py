"""Pipeline parallelism: schedules as data, their bubbles in theory, and a real executor.

A model's layers are cut into p stages, one per rank; a batch is cut into m micro-batches that
flow through the stages like a production line. While the line fills and drains, some stages
wait: the *bubble*. Sources: GPipe (Huang et al., NeurIPS 2019), 1F1B / PipeDream-Flush
(Narayanan et al., ICML 2021), interleaved 1F1B (Narayanan et al., "Efficient Large-Scale
Language Model Training on GPU Clusters Using Megatron-LM", SC 2021); past 1F1B: ZB-H1 (Qi et
al., "Zero Bubble Pipeline Parallelism", ICLR 2024) and ZB-V (its arXiv version), Chimera (Li &
Hoefler, SC 2021), DualPipe (DeepSeek-V3 technical report, section 3.2.1), TeraPipe (Li et al.,
ICML 2021).

    from toolkit.pipeline import make_schedule, check_schedule, simulate, run_pipeline
    s = make_schedule("1f1b", p=4, m=8)       # per stage, its ops: F0 F1 F2 F3 B0 F4 …
    simulate(s, forward=1, backward=2).bubble  # 3/11 = (p−1)/(m+p−1)
    run = run_pipeline(model.layers, x, y, schedule=s)   # 4 gloo ranks; run.table, run.grads

==============  ==================================================================================
module          holds
==============  ==================================================================================
`schedules`     `Op` (F, B, W), `Schedule` (layouts: loop, v, bidirectional; token slices; some
                backwards split, some whole), `naive`, `gpipe`, `one_f_one_b`, `interleaved`,
                `as_schedule` (lists of "F3"/"B3.1"/"W3" strings into a Schedule)
`zero_bubble`   `zb_h1`: 1F1B with the backward split into B and W (Qi et al. 2024)
`v_shape`       `zb_v`: two chunks per rank in a V, every backward split (ZB-V)
`bidirectional` `chimera`: down and up pipelines on the same ranks (Li & Hoefler 2021)
`dualpipe`      `dualpipe`: Chimera's two directions with the B/W split (DeepSeek-V3)
`terapipe`      `terapipe`: token slices of one sequence (Li et al. 2021)
`catalog`       `make_schedule` (any of the above by name), `NAMES`
`dependencies`  `needs` (who waits for whom), `run_order` (the sends and receives, simulated)
`validate`      `problems` (kinds: shape, missing, duplicate, order, mismatch, deadlock,
                in_flight), `check_schedule`, `ScheduleError`, `problems_by_case` (grade a
                schedule function)
`held`          `in_flight`, `peak_held`, `held_at_peak` (activations a stage holds; W-pending
                ones apart)
`bubble`        formulas: `bubble_fraction`, `bubble_time_ratio`, `pipeline_time`,
                `peak_activations` (a pure model: `toolkit.cost.bubble`, re-exported here)
`simulate`      `simulate` (ideal timeline from op times; DualPipe's F&B pairs), `idle_fraction`,
                `idle_within` (idle inside each stage's own span), `stage_times`
`work`          `Delay` (a layer that sleeps known times per sample: forward, input gradient,
                weight gradient), `delay_blocks`
`executor`      `run_pipeline` (spawns p ranks, one `PipelineRun` back)
`stage`         `run_stage` (one rank's part: receive, compute, send per op), `assign_layers`
`compute`       what a rank computes per op: F, B (whole, or input gradient only), W
`messages`      tags, who sends what to whom (`Routes`, `sent_messages`), a rank's `Mailbox`
==============  ==================================================================================
"""

from ..cost.bubble import (
    bubble_fraction, bubble_time, bubble_time_ratio, peak_activations, pipeline_time, step_time,
)
from .bidirectional import chimera
from .catalog import CLASSIC, NAMES, make_schedule
from .dependencies import needs, run_order
from .dualpipe import dualpipe
from .executor import PipelineRun, run_pipeline
from .held import held_at_peak, in_flight, peak_held
from .messages import sent_messages
from .schedules import (
    LAYOUTS, OP_KINDS, Op, Schedule, as_op, as_schedule, gpipe, interleaved, naive, one_f_one_b,
)
from .simulate import COLUMNS, Timeline, idle_fraction, idle_within, simulate, stage_times
from .stage import assign_layers, run_stage
from .terapipe import terapipe
from .v_shape import zb_v
from .validate import KINDS, Problem, ScheduleError, check_schedule, problems, problems_by_case
from .work import Delay, delay_blocks, no_delay
from .zero_bubble import zb_h1

__all__ = [
    "CLASSIC", "COLUMNS", "KINDS", "LAYOUTS", "NAMES", "OP_KINDS", "Delay", "Op", "PipelineRun",
    "Problem", "Schedule", "ScheduleError", "Timeline", "as_op", "as_schedule", "assign_layers",
    "bubble_fraction", "bubble_time", "bubble_time_ratio", "check_schedule", "chimera",
    "delay_blocks", "dualpipe", "gpipe", "held_at_peak", "idle_fraction", "idle_within",
    "in_flight", "interleaved",
    "make_schedule", "naive", "needs", "no_delay", "one_f_one_b", "peak_activations",
    "peak_held", "pipeline_time", "problems", "problems_by_case", "run_order", "run_pipeline",
    "run_stage", "sent_messages", "simulate", "stage_times", "step_time", "terapipe", "zb_h1",
    "zb_v",
]
