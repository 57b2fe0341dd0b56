"""Plotly figures of what ranks did and what it costs: pure functions, data in, figure out.

    from toolkit import comm, viz

    with comm.recording() as trace:
        spawn(work, world_size=4)
    viz.timeline(trace)                 # one row per rank, one bar per communication call
    viz.traffic_matrix(trace)           # point-to-point bytes from rank i to rank j
    viz.ring_animation(trace, inputs)   # a recorded ring all-reduce, step by step (ring_table)
    viz.cost_curves(table, fits)        # measured time vs size, fitted α-β model dotted
    viz.bus_bandwidth(table)            # nccl-tests bus bandwidth vs size
    viz.predicted_times(p, link)        # the model's time per algorithm, switch points marked
    viz.regime_curves(table, fits)      # measured time with the piecewise α-β model per regime
    viz.slice_speedups(table)           # the sliced ring's speed-up per slice count
    viz.gantt(run.table)                # a pipeline step, one row per stage (toolkit.pipeline)
    viz.gantt_compare(measured, ideal)  # a real run above its simulated ideal
    viz.gantt_memory(table, held)       # a schedule over what each stage holds at its peak
    viz.mesh_grid(layout, gpus_per_node=8)  # a dp×tp×pp(×cp) layout's ranks as a grid
    viz.time_bars(planner.plan(...))    # where the fastest layouts' step time goes
    viz.stage_bars(7.5e9, 64)           # model states per device for ZeRO stages 0-3
    viz.matmul_split("column", p)       # Y = X·A split over p ranks, every block's shape
    viz.tp_time_view(hidden=h, tp=8, tokens=n, bandwidth_gbs=50)  # TP all-reduces vs compute
    viz.recompute_view(model="gpt3-175b", seq_len=2048, batch=1)  # memory vs extra FLOPs
    viz.expert_loads(load, kept, capacity)   # an MoE router's choices per expert, kept/dropped
    viz.capacity_view(capacity_factor=1.25, imbalance=1.5)  # dropped, padding, all-to-all bytes

No function here starts processes or holds widgets; `toolkit.widgets` wires sliders to them.
"""

from .cost import bus_bandwidth, cost_curves, cost_terms, predicted_times, traffic_and_rounds
from .pipeline import gantt, gantt_compare, gantt_memory
from .planner import memory_time, mesh_grid, predicted_measured, time_bars
from .data_parallel import computation_graph, training_curves
from .experts import capacity_view, expert_loads, violation_curves
from .ddp import overlap_timeline, scaling_figure
from .memory import measured_vs_predicted, memory_bars, stage_bars
from .recompute import recompute_tradeoff, recompute_view
from .regimes import regime_curves, slice_speedups
from .ring import ring_animation, ring_table
from .tensor_parallel import matmul_split, tp_time_view, traffic_bars
from .timeline import timeline, traffic_matrix

__all__ = ["bus_bandwidth", "capacity_view", "computation_graph", "cost_curves", "cost_terms",
           "expert_loads", "gantt", "gantt_compare", "gantt_memory", "matmul_split",
           "measured_vs_predicted", "memory_bars", "memory_time", "mesh_grid", "overlap_timeline",
           "predicted_measured",
           "predicted_times", "recompute_tradeoff", "recompute_view", "regime_curves",
           "slice_speedups", "scaling_figure", "stage_bars", "time_bars", "training_curves",
           "ring_animation", "ring_table", "timeline", "tp_time_view", "traffic_and_rounds",
           "traffic_bars", "traffic_matrix", "violation_curves"]
