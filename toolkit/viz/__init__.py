"""Plotly figures of what ranks did: pure functions, data in, figure out.

    from toolkit import comm, viz

    with comm.recording() as trace:
        spawn(work, world_size=4)
    viz.timeline(trace)          # one row per rank, one bar per communication call
    viz.traffic_matrix(trace)    # point-to-point bytes from rank i to rank j

No function here starts processes or holds widgets; lessons wire sliders to them.
"""

from .timeline import timeline, traffic_matrix

__all__ = ["timeline", "traffic_matrix"]
