"""ipywidgets explorers: sliders wired to the pure figures of `toolkit.viz`.

    from toolkit import widgets
    widgets.cost_explorer(fit.link, p=64)    # last line of a cell: sliders, a verdict, a figure
    widgets.pipeline_explorer(p=4, m=8)      # schedule, p, m, v, t_b/t_f: Gantt, bubble
    widgets.schedules_explorer(p=4, m=8)     # lesson 11: ZB-H1, Chimera, TeraPipe; B/W split
    widgets.fsdp_explorer(psi=1e9, units=8)  # units, p, prefetch: a simulated step, gathered bytes
    widgets.tp_explorer()                    # lesson 12: TP all-reduces vs compute per link
    widgets.planner_explorer("gpt3-175b", gpus=1024, global_batch=1536)  # lesson 14
    widgets.recompute_explorer("gpt3-175b", seq_len=2048)   # lesson 14: memory vs extra FLOPs
    widgets.capacity_explorer()              # lesson 13: capacity × imbalance → drops, bytes

One module per explorer (`cost`, `memory`, `pipeline`, ...), each a thin shell: one pure
function maps slider values to what is shown and is tested without a browser; the explorer is a
`base.SliderExplorer` that holds the sliders and puts that function's output into an `Output`
area on every change (`base.show_in`). Lesson 04 builds its explorers from `SliderExplorer`
directly.
"""

from .base import SliderExplorer, plotly_bundle, show_in
from .experts import capacity_explorer
from .fsdp import FSDPExplorer, fsdp_explorer, fsdp_view
from .memory import MemoryExplorer, memory_explorer, memory_view
from .pipeline import PipelineExplorer, pipeline_explorer, pipeline_view
from .planner import PlannerExplorer, planner_explorer, planner_view
from .recompute import recompute_explorer
from .schedules import SchedulesExplorer, schedules_explorer, schedules_view
from .tensor_parallel import TPExplorer, tp_explorer
from .cost import (
    ALPHA_US, BANDWIDTH_GBS, DEFAULT_LINK, P_CHOICES, SIZE_CHOICES, CostExplorer, cost_explorer,
    cost_view,
)

__all__ = ["ALPHA_US", "BANDWIDTH_GBS", "CostExplorer", "DEFAULT_LINK", "FSDPExplorer",
           "MemoryExplorer", "P_CHOICES", "PipelineExplorer", "PlannerExplorer", "SIZE_CHOICES",
           "SchedulesExplorer", "SliderExplorer", "TPExplorer", "cost_explorer", "cost_view",
           "fsdp_explorer",
           "fsdp_view", "memory_explorer", "memory_view", "pipeline_explorer", "pipeline_view",
           "planner_explorer", "planner_view", "plotly_bundle", "recompute_explorer",
           "schedules_explorer", "schedules_view", "show_in", "capacity_explorer", "tp_explorer"]
