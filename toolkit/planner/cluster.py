"""A cluster as the planner sees it: nodes of identical accelerators, two kinds of link, a peak.

The planner needs only a few numbers (Narayanan et al., "Efficient Large-Scale Language Model
Training on GPU Clusters Using Megatron-LM", SC 2021, §3 reasons with the same ones):

* accelerators per node and memory per accelerator (what must fit);
* the link *inside* a node (NVLink: tensor parallelism lives there) and the link *between*
  nodes (InfiniBand: data and pipeline parallelism cross it), each as an α-β pair
  (`toolkit.cost.AlphaBeta`: α seconds per message, β seconds per byte, per accelerator and
  direction);
* peak dense FLOP/s per accelerator (`toolkit.flops.PEAK_FLOPS`).

Presets carry their sources; α values are assumed orders of magnitude (NCCL's small-message
latency), bandwidths are datasheet line rates per GPU and direction, which real collectives reach
only in part (nccl-tests' bus bandwidth on a DGX A100 is ~230 of NVLink's 300 GB/s).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..arguments import check_int, check_ints, check_positives
from ..cost import AlphaBeta
from ..flops import A100_BF16, H100_SXM_BF16
from ..memory import GiB

__all__ = ["CLUSTERS", "Cluster", "cluster", "laptop"]


@dataclass(frozen=True)
class Cluster:
    """Identical nodes of identical accelerators; validated on construction."""

    name: str
    """Label shown in tables."""
    gpus_per_node: int
    """Accelerators (or CPU ranks) per node, joined by the intra-node link."""
    memory_bytes: float
    """Memory of one accelerator, bytes (an 80 GB A100 holds 80 GiB)."""
    intra: AlphaBeta
    """Link between two accelerators of one node, per accelerator and direction."""
    inter: AlphaBeta
    """Link between nodes, per accelerator and direction (a node's NICs shared out)."""
    peak_flops: float
    """Peak dense FLOP/s of one accelerator at the training precision."""
    nodes: int = 1
    """Number of nodes; the world size is nodes × gpus_per_node."""
    source: str = ""
    """Where the numbers come from."""

    def __post_init__(self) -> None:
        check_ints("Cluster", gpus_per_node=self.gpus_per_node, nodes=self.nodes)
        check_positives("Cluster", memory_bytes=self.memory_bytes, peak_flops=self.peak_flops)
        for field in ("intra", "inter"):
            link = getattr(self, field)
            if not isinstance(link, AlphaBeta) or link.alpha < 0 or link.beta < 0:
                raise ValueError(f"Cluster: {field} must be an AlphaBeta with α, β >= 0, "
                                 f"got {link!r}")

    @property
    def world_size(self) -> int:
        """Accelerators in all: nodes × gpus_per_node."""
        return self.nodes * self.gpus_per_node

    def with_gpus(self, n: int) -> "Cluster":
        """The same cluster with `n` accelerators: whole nodes, or part of one node when
        n < gpus_per_node (then every link is the intra-node one)."""
        check_int("Cluster.with_gpus", "n", n)
        if n < self.gpus_per_node:
            return dataclasses.replace(self, gpus_per_node=n, nodes=1)
        if n % self.gpus_per_node:
            raise ValueError(f"Cluster.with_gpus: n={n} is not a whole number of "
                             f"{self.gpus_per_node}-GPU nodes")
        return dataclasses.replace(self, nodes=n // self.gpus_per_node)

    def link(self, span: int) -> AlphaBeta:
        """The link a group uses whose members lie within `span` consecutive ranks: the
        intra-node link when span <= gpus_per_node (ranks are numbered node by node)."""
        return self.intra if span <= self.gpus_per_node else self.inter


CLUSTERS: dict[str, Cluster] = {c.name: c for c in (
    Cluster("dgx-a100-80gb", 8, 80 * GiB,
            intra=AlphaBeta(alpha=5e-6, beta=1 / 300e9),    # NVLink 3: 600 GB/s both ways
            inter=AlphaBeta(alpha=10e-6, beta=1 / 25e9),    # one HDR IB 200 Gb/s NIC per GPU
            peak_flops=A100_BF16,
            source="NVIDIA DGX A100 and A100 datasheets: 8 × A100 80 GB, NVLink 3 600 GB/s "
                   "bidirectional per GPU, 8 × 200 Gb/s HDR InfiniBand, 312 TFLOP/s bf16"),
    Cluster("dgx-h100", 8, 80 * GiB,
            intra=AlphaBeta(alpha=5e-6, beta=1 / 450e9),    # NVLink 4: 900 GB/s both ways
            inter=AlphaBeta(alpha=10e-6, beta=1 / 50e9),    # one NDR IB 400 Gb/s NIC per GPU
            peak_flops=H100_SXM_BF16,
            source="NVIDIA DGX H100 and H100 SXM datasheets: 8 × H100 80 GB, NVLink 4 900 GB/s "
                   "bidirectional per GPU, 8 × 400 Gb/s NDR InfiniBand, 989 TFLOP/s bf16"),
    Cluster("laptop", 4, 2 * GiB,
            intra=AlphaBeta(alpha=100e-6, beta=1e-9), inter=AlphaBeta(alpha=100e-6, beta=1e-9),
            peak_flops=10e9,
            source="order of magnitude for gloo ranks on one laptop (lesson 03 fits this machine's"
                   " own: ~100 µs per message, ~1 GB/s); use `laptop(...)` with measured numbers"),
)}
"""Named presets (copy with `cluster(name, nodes=...)`)."""


def cluster(name: str, *, nodes: int = 1) -> Cluster:
    """The preset called `name` (a key of `CLUSTERS`) with `nodes` nodes."""
    try:
        base = CLUSTERS[name]
    except KeyError:
        raise ValueError(f"cluster: unknown preset {name!r}; known: {sorted(CLUSTERS)}") from None
    return dataclasses.replace(base, nodes=nodes)


def laptop(*, link: AlphaBeta, peak_flops: float, ranks: int = 4,
           memory_bytes: float = 2 * GiB) -> Cluster:
    """CPU ranks on this machine as a one-node cluster: `link` from `toolkit.cost.fit_alpha_beta`
    over a small sweep, `peak_flops` the FLOP/s one rank gets while all of them compute (a
    matmul timing, `toolkit.experiments.planner`), `memory_bytes` a share of RAM per rank."""
    return Cluster("laptop (measured)", ranks, memory_bytes, intra=link, inter=link,
                   peak_flops=peak_flops, source="measured on this machine")
