"""The library behind every lesson, lab and check of the course.

One idea per module (see docs/architecture.md for the layers and which may import which):
`launch` starts ranks, `comm` records what they send, `models` holds the tiny models everyone
shares, `chunks` and `arguments` the split rule and argument checks every layer uses, `viz`
draws, and later modules build the algorithms (collectives, data/pipeline/tensor parallel) on
top. `context_parallel` splits the sequence (ring attention, Ulysses), `recompute` trades compute
for activation memory, `flops` counts FLOPs and MFU/HFU, `memory` computes training memory per
ZeRO stage, `planner` predicts memory per GPU and step time of dp × tp × pp × cp layouts on a
cluster and ranks them, `experiments` runs the algorithms on ranks beside those models,
`checkpoint` saves atomically (rank 0 writes) and resumes every rank, `hub` builds nbgitpuller
links and per-student memory limits for a class's JupyterHub.
"""

__version__ = "0.1.0"
