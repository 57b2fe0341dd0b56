"""DualPipe: Chimera's two directions with ZB's B/W split, as DeepSeek-V3 trains.

DeepSeek-AI, "DeepSeek-V3 Technical Report" (arXiv:2412.19437), section 3.2.1 and Figure 5. As
in Chimera (Li & Hoefler, SC 2021), rank r holds stage r of the *down* pipeline (chunk 0) and a
replica of stage P − 1 − r of the *up* one (chunk 1; the ``"bidirectional"`` layout of
`toolkit.pipeline.schedules`): parameters 2×. Half the micro-batches enter at rank 0, half at
rank P − 1. For a rank, the *near* pipeline is the one whose entry is on its side of the line
(down for r < P/2, up for the others): it is at position h = min(r, P − 1 − r) of it, and at
position P − 1 − h of the *far* one. Each rank runs eight phases, the eight steps of DeepSeek's
open-source implementation (github.com/deepseek-ai/DualPipe, `DualPipe.step`; Figure 5 draws the
result for P = 8, N = 20), with N micro-batches, N/2 per direction, n = P/2:

==========  ===========================  ====================================================
phase       ops, repeated                 what it does
==========  ===========================  ====================================================
1           2(n − h − 1) × F near         warm-up: the near pipeline's forwards
2           (h + 1) × F near, F far       both directions' forwards in turn
3           (n − h − 1) × B far, W, F far the far backward split, its W right away (the B's
                                          gradient leaves before W runs)
4           (N/2 − P + h + 1) ×           the steady state: pairs of one forward and one
            F near, B far, F far, B near  backward of the other direction ("F&B")
5           (n − h − 1) × B far, F far,   the far forwards run out
            B near
6           (h + 1) × B far, B near       the drain; the second half of these 2(h + 1)
                                          backwards is split
7           (n − h − 1) × W, B near       the W's owed fill the drain; each B near split
8           (h + 1) × W                   the last W's
==========  ===========================  ====================================================

Backwards that phases 4 to 6 do not split run whole (a B with no W: the schedule is
``mixed``), as DualPipe runs them: splitting only pays where a W fills a gap. Each F&B pair is
what DualPipe overlaps on a GPU: the forward's compute with the backward's communication (the
expert-parallel all-to-all and the pipeline sends) and the reverse, so the pair takes F&B ≤
F + B. Here the two ops run one after the other; the executor posts the backward's receive
before the forward computes (`toolkit.pipeline.messages`), so the gradient lands meanwhile.

DeepSeek-V3's Table 2: bubble (P/2 − 1)(F&B + B − 3W), parameters 2×, activations P + 1
micro-batches per rank, against 1F1B's (P − 1)(F + B), 1×, P and ZB1P's (P − 1)(F + B − 2W),
1×, P, where F is a chunk's forward, B its *whole* backward (input and weight gradients), W
the weight part. In this module's terms (B = t_B + t_W, F&B = F + B, messages free) the
formula is (P/2 − 1)(t_F + 2t_B − t_W); `toolkit.cost.bubble` holds it and the tests compare
it with the simulator. DualPipe needs P even and N ≥ 2P, N even.

    s = dualpipe(4, 8)       # rank 0: F0 F1 F2 F4.1 … (x.1: the up pipeline, micro-batches 4-7)
"""

from __future__ import annotations

from collections import deque

from ..cost.bubble import check_sizes
from .schedules import Op, Schedule


class _Ops:
    """One rank's ops as the phases append them: micro-batches in order per direction, W's in
    the order their B's ran."""

    def __init__(self, half: int) -> None:
        self.first = (0, half)                   # down: 0 … N/2 − 1, up: N/2 … N − 1
        self.forwards, self.backwards = [0, 0], [0, 0]
        self.owed: deque[tuple[int, int]] = deque()
        self.ops: list[Op] = []

    def f(self, chunk: int) -> None:
        self.ops.append(Op("F", self.first[chunk] + self.forwards[chunk], chunk))
        self.forwards[chunk] += 1

    def b(self, chunk: int, split: bool = False) -> None:
        mb = self.first[chunk] + self.backwards[chunk]
        self.ops.append(Op("B", mb, chunk))
        self.backwards[chunk] += 1
        if split:
            self.owed.append((mb, chunk))

    def w(self) -> None:
        mb, chunk = self.owed.popleft()
        self.ops.append(Op("W", mb, chunk))


def _rank(p: int, n_mb: int, r: int) -> tuple[Op, ...]:
    """Rank r's ops in the eight phases of the module docstring."""
    n, h, half = p // 2, min(r, p - 1 - r), n_mb // 2
    near = 0 if r < n else 1
    far = 1 - near
    out = _Ops(half)
    for _ in range(2 * (n - h - 1)):                                  # 1
        out.f(near)
    for _ in range(h + 1):                                            # 2
        out.f(near)
        out.f(far)
    for _ in range(n - h - 1):                                        # 3
        out.b(far, split=True)
        out.w()
        out.f(far)
    for _ in range(half - p + h + 1):                                 # 4
        out.f(near)
        out.b(far)
        out.f(far)
        out.b(near)
    for _ in range(n - h - 1):                                        # 5
        out.b(far)
        out.f(far)
        out.b(near)
    for i in range(2 * (h + 1)):                                      # 6
        out.b(far if i % 2 == 0 else near, split=i >= h + 1)
    for _ in range(n - h - 1):                                        # 7
        out.w()
        out.b(near, split=True)
    for _ in range(h + 1):                                            # 8
        out.w()
    return tuple(out.ops)


def dualpipe(p: int, m: int) -> Schedule:
    """DualPipe (DeepSeek-V3 report, section 3.2.1, Figure 5) for p ranks (even) and m
    micro-batches in all (even, at least 2p): the first m/2 go down (chunk 0), the others up
    (chunk 1). See the module docstring for the phases."""
    check_sizes("dualpipe", p, m)
    if p % 2 or m % 2 or m < 2 * p:
        raise ValueError(f"dualpipe: p (ranks) must be even and m (micro-batches, both "
                         f"directions) even and at least 2p, got p = {p}, m = {m}: each "
                         f"direction needs p micro-batches to reach its steady state (DualPipe "
                         f"asserts the same); try p = {p + p % 2}, m = "
                         f"{max(2 * (p + p % 2), m + m % 2)}")
    return Schedule(tuple(_rank(p, m, r) for r in range(p)), m=m, v=2, name="dualpipe",
                    layout="bidirectional", mixed=True)


__all__ = ["dualpipe"]
