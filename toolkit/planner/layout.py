"""One way to lay a training run over ranks: dp × tp × pp × cp, a ZeRO stage, micro-batches.

Four axes, one per dimension of the work (lesson 14): the batch splits over data-parallel ranks
(dp), the sequence over context-parallel ranks (cp), the layers over pipeline stages (pp), the
hidden dimension over tensor-parallel ranks (tp). Their product is the world size, which
`Layout.check` asserts (as torchtitan's `ParallelDims._validate` does).

Ranks form a 4-D grid, tp varying fastest, then cp, then dp, then pp (Megatron-LM's default
order "tp-cp-dp-pp"; torchtitan's mesh is the same with pp outermost):

    rank = ((i_pp · dp + i_dp) · cp + i_cp) · tp + i_tp

so a tensor-parallel group is tp consecutive ranks (inside a node when tp <= GPUs per node,
where its four all-reduces per layer want NVLink), and pipeline neighbours are furthest apart
(they exchange one activation per micro-batch, the least traffic of all).

Experts (mixture-of-experts models) get a layout of their own inside each pipeline stage: its
tp·cp·dp ranks are laid out again as ep × edp for the MoE layers, ep fastest ("MoE parallel
folding", Liu et al., 2025, arXiv:2504.14960, as in Megatron-Core). An expert-parallel group is
ep consecutive ranks of a stage, each holding E/ep whole experts and exchanging tokens with the
others by all-to-all; an expert-data-parallel group ("edp", tp·cp·dp/ep ranks) holds the same
experts and reduces their gradients. ep = 1 is a dense model's layout, and ep is not a factor of
the world size (it folds over ranks that dp, cp and tp already count).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from ..arguments import check_ints, is_int
from ..memory import ATTENTION, RECOMPUTE

__all__ = ["AXES", "Layout"]

AXES = ("pp", "dp", "cp", "tp")
"""Axes of the rank grid, outermost first."""
EXPERT_AXES = ("ep", "edp")
"""Groups of the MoE layers inside a stage: expert-parallel, expert-data-parallel."""
_LABEL = {"none": "", "selective": " sel", "full": " rc"}  # recompute policy in `label()`


@dataclass(frozen=True)
class Layout:
    """A parallel layout; validated on construction (`check(world_size)` for the product)."""

    dp: int = 1
    """Data-parallel degree: replicas (or ZeRO shards) that each take dp-th of the batch."""
    tp: int = 1
    """Tensor-parallel degree: ranks that split every weight matrix (Megatron-LM)."""
    pp: int = 1
    """Pipeline-parallel degree: stages, each holding pp-th of the layers."""
    cp: int = 1
    """Context-parallel degree: ranks that split the sequence (ring attention / Ulysses)."""
    zero: int = 0
    """ZeRO stage 0-3 over the data-parallel (dp × cp) group; 0 is plain data parallelism."""
    micro_batches: int = 1
    """m: micro-batches per step (pipeline micro-batches, or gradient accumulation at pp = 1)."""
    recompute: str = "none"
    """Activation recomputation: "none", "selective" (the attention core, Korthikanti §5) or
    "full" (every layer keeps only its input)."""
    attention: str = "materialised"
    """"materialised" (the s×s scores kept for backward) or "flash" (none kept: FlashAttention,
    or ring attention's online softmax)."""
    sequence_parallel: bool = True
    """With tp > 1, keep LayerNorm/dropout activations split along the sequence (Korthikanti)."""
    ep: int = 1
    """Expert-parallel degree of the MoE layers: ep consecutive ranks of a stage share the experts,
    E/ep each (module docstring); it must divide tp·cp·dp. 1 for a dense model."""

    def __post_init__(self) -> None:
        check_ints("Layout", dp=self.dp, tp=self.tp, pp=self.pp, cp=self.cp,
                   micro_batches=self.micro_batches, ep=self.ep)
        if self.stage_size % self.ep:
            raise ValueError(f"Layout: ep={self.ep} must divide the ranks of one pipeline stage, "
                             f"tp × cp × dp = {self.tp} × {self.cp} × {self.dp} = "
                             f"{self.stage_size}, over which the experts are laid out")
        if not is_int(self.zero) or self.zero not in (0, 1, 2, 3):
            raise ValueError(f"Layout: zero must be a ZeRO stage 0, 1, 2 or 3, got {self.zero!r}")
        if self.recompute not in RECOMPUTE:
            raise ValueError(f"Layout: recompute must be one of {RECOMPUTE}, "
                             f"got {self.recompute!r}")
        if self.attention not in ATTENTION:
            raise ValueError(f"Layout: attention must be one of {ATTENTION}, "
                             f"got {self.attention!r}")

    @property
    def world_size(self) -> int:
        """dp × tp × pp × cp."""
        return self.dp * self.tp * self.pp * self.cp

    @property
    def stage_size(self) -> int:
        """Ranks of one pipeline stage: tp × cp × dp."""
        return self.tp * self.cp * self.dp

    @property
    def edp(self) -> int:
        """Expert-data-parallel degree: ranks of a stage that hold the same experts,
        tp·cp·dp / ep."""
        return self.stage_size // self.ep

    def check(self, world_size: int) -> "Layout":
        """Raise unless dp × tp × pp × cp == `world_size`; return self."""
        if self.world_size != world_size:
            raise ValueError(f"Layout: dp × tp × pp × cp = {self.dp} × {self.tp} × "
                             f"{self.pp} × {self.cp} = {self.world_size}, expected the world "
                             f"size {world_size}")
        return self

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """Sizes of the rank grid along `AXES` (pp, dp, cp, tp)."""
        return (self.pp, self.dp, self.cp, self.tp)

    def coords(self, rank: int) -> dict[str, int]:
        """Rank's index along each axis, e.g. {"pp": 1, "dp": 0, "cp": 0, "tp": 1}."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"Layout.coords: rank must be in 0 … {self.world_size - 1}, "
                             f"got {rank}")
        out = {}
        for axis, size in zip(reversed(AXES), reversed(self.shape)):
            rank, out[axis] = divmod(rank, size)
        return {axis: out[axis] for axis in AXES}

    def rank(self, **coords: int) -> int:
        """Inverse of `coords` (missing axes count as 0)."""
        r = 0
        for axis, size in zip(AXES, self.shape):
            i = coords.get(axis, 0)
            if not 0 <= i < size:
                raise ValueError(f"Layout.rank: {axis} index must be in 0 … {size - 1}, got {i}")
            r = r * size + i
        return r

    def groups(self, axis: str) -> list[list[int]]:
        """The process groups along `axis`: ranks that differ only in that coordinate
        (e.g. "tp": every tensor-parallel group), each in increasing order. "ep" and "edp":
        the MoE layers' expert-parallel and expert-data-parallel groups (module docstring)."""
        if axis in EXPERT_AXES:
            return self._expert_groups(axis)
        if axis not in AXES:
            raise ValueError(f"Layout.groups: axis must be one of {AXES + EXPERT_AXES}, "
                             f"got {axis!r}")
        others = [a for a in AXES if a != axis]
        sizes = dict(zip(AXES, self.shape))
        out = []
        for fixed in itertools.product(*(range(sizes[a]) for a in others)):
            base = dict(zip(others, fixed))
            out.append([self.rank(**base, **{axis: i}) for i in range(sizes[axis])])
        return sorted(out)

    def _expert_groups(self, axis: str) -> list[list[int]]:
        n, out = self.stage_size, []
        for stage in range(self.pp):
            base = stage * n
            if axis == "ep":  # ep consecutive ranks of the stage
                out += [[base + b * self.ep + j for j in range(self.ep)]
                        for b in range(n // self.ep)]
            else:  # the same place in every ep group of the stage
                out += [[base + b * self.ep + j for b in range(n // self.ep)]
                        for j in range(self.ep)]
        return sorted(out)

    def span(self, axis: str) -> int:
        """How many consecutive ranks one group along `axis` reaches across: the stride of the
        axis times its size. A group whose span fits in a node uses the intra-node link.
        "ep": ep; "edp": the whole stage, tp·cp·dp."""
        if axis == "ep":
            return self.ep
        if axis == "edp":
            return self.stage_size
        if axis not in AXES:
            raise ValueError(f"Layout.span: axis must be one of {AXES}, got {axis!r}")
        i = AXES.index(axis)
        span = 1
        for size in self.shape[i:]:
            span *= size
        return span

    def label(self) -> str:
        """Short text, e.g. "dp4·tp2·pp1 z1 m8" or "dp4·tp1·pp1·ep2 z0 m1" (then " rc" for full
        recomputation, " sel" for selective, " flash" for flash-style attention)."""
        cp = f"·cp{self.cp}" if self.cp > 1 else ""
        cp += f"·ep{self.ep}" if self.ep > 1 else ""
        rc = _LABEL[self.recompute] + (" flash" if self.attention == "flash" else "")
        return f"dp{self.dp}·tp{self.tp}·pp{self.pp}{cp} z{self.zero} m{self.micro_batches}{rc}"
