"""Pipeline schedules as plain data: for every stage (rank), the ordered list of its ops.

An op is the forward ``F``, the backward ``B`` or the weight-gradient ``W`` of one micro-batch on
one model chunk. A stage runs its list top to bottom; an op that needs another stage's output waits
for that message. In a schedule without W ops, B is the whole backward. A schedule with W ops
*splits* it (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, section 2): B computes
only the gradient of the stage's input (what the previous stage waits for) and W, later, the
gradients of the stage's weights; every B then needs its W on the same stage.
Nothing here starts processes: the same `Schedule` is checked by `toolkit.pipeline.validate`,
timed by `toolkit.pipeline.simulate` and run on real ranks by `toolkit.pipeline.executor`.

Notation (as in the papers): p stages (ranks), m micro-batches, v model chunks per rank.

* **naive model parallel**: the whole batch as one micro-batch (m = 1): F on stage 0, 1, …,
  p−1, then B back down. One stage works at a time.
* **GPipe** (Huang et al., NeurIPS 2019): every stage runs all m forwards, then all m backwards.
* **1F1B** (PipeDream-Flush; Narayanan et al., "Memory-Efficient Pipeline-Parallel DNN
  Training", ICML 2021): stage r runs min(p−r−1, m) warm-up forwards, then alternates one
  forward and one backward, then drains the remaining backwards. Same bubble as GPipe, but at
  most p − r micro-batches are in flight on stage r (GPipe: m).
* **interleaved 1F1B** (Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
  Clusters Using Megatron-LM", SC 2021, section 2.2.2): rank r holds v chunks; chunk c of rank r
  is virtual stage c·p + r of the p·v-stage model. Micro-batches go in groups of p: a rank runs
  the forward of a group on chunk 0, then on chunk 1, …; backwards mirror it from chunk v−1
  down. Warm-up length 2(p−r−1) + (v−1)p as in Megatron-LM's
  ``forward_backward_pipelining_with_interleaving``. Megatron-LM asks that p divide m; here
  m ≤ p is allowed too (one group). Other m deadlock for some v (a short last group lets a
  stage run ahead to a chunk whose input comes after its own backward), so they raise.

Layouts (how a rank's chunks sit in the model): ``"loop"``, Megatron's (chunk c of rank r is
virtual stage c·p + r; every micro-batch visits all p·v of them); ``"v"``, ZB-V's (Qi et al.,
arXiv:2401.10241, the version that adds ZB-V: two chunks per rank, chunk 0 of rank r is virtual
stage r and chunk 1 is virtual stage 2p−1−r, so a micro-batch goes down the ranks and back up
and rank 0 holds both the first and the last stage); and ``"bidirectional"``, Chimera's (Li &
Hoefler, SC 2021, section 3.1: two pipelines over the same p stages; chunk 0 of rank r is stage
r of the *down* pipeline, chunk 1 is stage p−1−r of the *up* one; a micro-batch runs in one
pipeline, the one its ops' chunk names), which DualPipe shares. A schedule over token slices of
one sequence (TeraPipe, Li et al., ICML 2021) sets ``sequence``: slice j's forward reads the keys
and values of slices < j on the same stage, and its backward needs the gradients that slices
> j send back into them. The schedules past 1F1B are in `zero_bubble`, `v_shape`,
`bidirectional`, `dualpipe` and `terapipe`; `catalog.make_schedule` builds any of them by name.

Which backwards are split: a B whose W is on the same stage computes only the input gradient;
a B without one is the whole backward. A schedule with W ops must give every B its W unless it
sets ``mixed`` (DualPipe splits only the backwards whose W fills a gap; DeepSeek-V3 technical
report, section 3.2.1, Figure 5).

Text form: ``"F3"`` is the forward of micro-batch 3 (chunk 0), ``"B3.1"`` the backward of
micro-batch 3 on chunk 1, ``"W3"`` its weight gradient. `as_schedule` turns lists of such
strings (or ``(kind, mb, chunk)`` tuples) into a `Schedule`, so a student's schedule function
can return plain lists.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from ..cost.bubble import check_sizes

OP_KINDS = ("F", "B", "W")
"""Op kinds: forward, backward (input gradient when the schedule has W ops), weight gradient."""
LAYOUTS = ("loop", "v", "bidirectional")
"""How chunks map onto the model (see the module docstring)."""

_TEXT = re.compile(r"^\s*([FBWfbw])\s*(\d+)(?:\.(\d+))?\s*$")


@dataclass(frozen=True, order=True)
class Op:
    """One step of a stage: the forward (``"F"``), backward (``"B"``) or weight gradient
    (``"W"``) of micro-batch `mb` on model chunk `chunk` (0 unless the rank holds several)."""

    kind: str
    """``"F"``, ``"B"`` or ``"W"``."""
    mb: int
    """Micro-batch index, 0 … m−1."""
    chunk: int = 0
    """Model chunk on this rank, 0 … v−1."""

    def __str__(self) -> str:
        return f"{self.kind}{self.mb}" + (f".{self.chunk}" if self.chunk else "")


def as_op(item: Op | str | Sequence) -> Op:
    """An `Op` from an `Op`, a string ``"F3"`` / ``"B3.1"``, or a tuple ``("F", 3[, chunk])``."""
    if isinstance(item, Op):
        return item
    if isinstance(item, str):
        match = _TEXT.match(item)
        if not match:
            raise ValueError(f"cannot read op {item!r}: write 'F<micro-batch>', "
                             f"'B<micro-batch>' or 'W<micro-batch>', with '.<chunk>' for a "
                             f"rank's second chunk (e.g. 'F3', 'B0.1', 'W2')")
        kind, mb, chunk = match.groups()
        return Op(kind.upper(), int(mb), int(chunk or 0))
    if isinstance(item, (tuple, list)) and len(item) in (2, 3):
        try:
            return Op(str(item[0]).upper(), int(item[1]), int(item[2]) if len(item) == 3 else 0)
        except (TypeError, ValueError):
            pass
    raise ValueError(f"cannot read op {item!r}: expected an Op, a string like 'F3' or a tuple "
                     f"('F', micro-batch[, chunk]) with kind F, B or W")


@dataclass(frozen=True)
class Schedule:
    """Per stage, the ordered ops it runs: ``schedule.stages[r]`` is rank r's list."""

    stages: tuple[tuple[Op, ...], ...]
    """One tuple of ops per stage (rank), in the order the stage runs them."""
    m: int
    """Number of micro-batches (token slices when `sequence`)."""
    v: int = 1
    """Model chunks per rank; 1 except for interleaved (loop) and Chimera (2) schedules."""
    name: str = "custom"
    """Where it came from: a name `make_schedule` knows, or ``"custom"``."""
    layout: str = "loop"
    """``"loop"`` or ``"bidirectional"`` (see the module docstring)."""
    sequence: bool = False
    """Micro-batches are token slices of one sequence, in order (TeraPipe)."""
    mixed: bool = False
    """Some backwards whole, some split: a B with no W on its stage is the whole backward
    (DualPipe); otherwise a schedule with W ops needs one for every B."""

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"Schedule: layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.layout != "loop" and self.v != 2:
            raise ValueError(f"Schedule: the {self.layout!r} layout has two chunks per rank "
                             f"(v = 2), got v = {self.v}")

    @property
    def p(self) -> int:
        """Number of stages (ranks)."""
        return len(self.stages)

    @property
    def split(self) -> bool:
        """Whether the backward is split into B (input gradient) and W (weight gradient)."""
        return any(op.kind == "W" for ops in self.stages for op in ops)

    def split_on(self, stage: int) -> frozenset[tuple[int, int]]:
        """The (micro-batch, chunk) pairs whose backward `stage` splits: those with a W there."""
        return frozenset((op.mb, op.chunk) for op in self.stages[stage] if op.kind == "W")

    @property
    def depth(self) -> int:
        """Stages a micro-batch passes through: p·v (loop, v) or p (bidirectional)."""
        return self.p if self.layout == "bidirectional" else self.p * self.v

    @property
    def share(self) -> float:
        """Fraction of a stage's layers one chunk holds: 1/v (loop, v), 1 (bidirectional: each
        chunk is a whole stage of its pipeline)."""
        return 1.0 if self.layout == "bidirectional" else 1.0 / self.v

    def __getitem__(self, stage: int) -> tuple[Op, ...]:
        return self.stages[stage]

    def __len__(self) -> int:
        return len(self.stages)

    def __str__(self) -> str:
        return "\n".join(f"stage {r}: " + " ".join(map(str, ops))
                         for r, ops in enumerate(self.stages))

    def virtual_stage(self, stage: int, chunk: int) -> int:
        """Position of (rank `stage`, chunk `chunk`) on its micro-batches' path: chunk·p + stage
        (loop, Megatron); stage or 2p−1−stage (v: chunk 0 down, chunk 1 back up); or,
        bidirectional, stage (down, chunk 0) or p−1−stage (up, chunk 1)."""
        if self.layout == "loop":
            return chunk * self.p + stage
        if self.layout == "v":
            return stage if chunk == 0 else 2 * self.p - 1 - stage
        return stage if chunk == 0 else self.p - 1 - stage

    def place(self, virtual: int, chunk: int = 0) -> tuple[int, int]:
        """(rank, chunk) that holds position `virtual` on the path of a micro-batch whose ops
        are on `chunk` (which only the bidirectional layout needs: its pipeline)."""
        if self.layout == "loop":
            return virtual % self.p, virtual // self.p
        if self.layout == "v":
            return (virtual, 0) if virtual < self.p else (2 * self.p - 1 - virtual, 1)
        return (virtual, 0) if chunk == 0 else (self.p - 1 - virtual, 1)

    def pipe(self, mb: int) -> int:
        """The chunk micro-batch `mb`'s ops name first (its pipeline, bidirectional); 0 if none."""
        for ops in self.stages:
            for op in ops:
                if op.mb == mb:
                    return op.chunk
        return 0


def as_schedule(stages: Schedule | Iterable[Iterable[Op | str | Sequence]], *,
                m: int | None = None, v: int | None = None, name: str = "custom",
                layout: str | None = None, sequence: bool | None = None,
                mixed: bool | None = None) -> Schedule:
    """A `Schedule` from per-stage lists of ops (`Op`, ``"F3"``, ``("B", 3)``, ``"W3"``, …).

    m and v default to what the ops mention (largest micro-batch + 1, largest chunk + 1; 2 for
    the two-chunk layouts); pass them when grading, so a schedule that forgets the last
    micro-batch is caught. `layout`, `sequence` and `mixed` default to a given `Schedule`'s
    own, else ``"loop"``, False and False.
    """
    if isinstance(stages, Schedule):
        if m is None and v is None and layout is None and sequence is None and mixed is None:
            return stages
        layout = stages.layout if layout is None else layout
        sequence = stages.sequence if sequence is None else sequence
        mixed = stages.mixed if mixed is None else mixed
        stages, name = stages.stages, stages.name
    rows = tuple(tuple(as_op(item) for item in row) for row in stages)
    ops = [op for row in rows for op in row]
    layout = layout or "loop"
    m = m if m is not None else (max((op.mb for op in ops), default=-1) + 1)
    if v is None:
        v = 2 if layout != "loop" else max((op.chunk for op in ops), default=0) + 1
    return Schedule(rows, m=m, v=v, name=name, layout=layout, sequence=bool(sequence),
                    mixed=bool(mixed))


def naive(p: int) -> Schedule:
    """Naive model parallel: one batch, no micro-batches; stage r runs F0 then B0.

    Only one stage is busy at any time: idle fraction (p−1)/p.
    """
    check_sizes("naive", p, 1)
    return Schedule(tuple((Op("F", 0), Op("B", 0)) for _ in range(p)), m=1, name="naive")


def gpipe(p: int, m: int) -> Schedule:
    """GPipe (Huang et al. 2019): every stage runs F0 … F(m−1), then B0 … B(m−1).

    Idle fraction (p−1)/(m+p−1); every stage holds the activations of all m micro-batches.
    """
    check_sizes("gpipe", p, m)
    row = tuple(Op("F", i) for i in range(m)) + tuple(Op("B", i) for i in range(m))
    return Schedule(tuple(row for _ in range(p)), m=m, name="gpipe")


def one_f_one_b(p: int, m: int) -> Schedule:
    """1F1B / PipeDream-Flush (Narayanan et al. 2021): warm up, alternate, drain.

    Stage r: forwards F0 … F(w−1) with w = min(p−r−1, m), then for each remaining micro-batch
    one forward and one backward (F(w+k), Bk), then the last w backwards. Same idle fraction as
    GPipe, (p−1)/(m+p−1), with at most min(p−r, m) micro-batches in flight on stage r.
    """
    check_sizes("one_f_one_b", p, m)
    stages = []
    for r in range(p):
        warmup = min(p - r - 1, m)
        row = [Op("F", i) for i in range(warmup)]
        for k in range(m - warmup):
            row += [Op("F", warmup + k), Op("B", k)]
        row += [Op("B", i) for i in range(m - warmup, m)]
        stages.append(tuple(row))
    return Schedule(tuple(stages), m=m, name="1f1b")


def _interleaved_order(p: int, m: int, v: int, kind: str) -> list[Op]:
    """Megatron's order of a rank's v·m ops of one kind: groups of p micro-batches, chunk by
    chunk (backwards from the last chunk)."""
    chunks = range(v) if kind == "F" else range(v - 1, -1, -1)
    order = []
    for start in range(0, m, p):
        group = range(start, min(start + p, m))
        order += [Op(kind, mb, c) for c in chunks for mb in group]
    return order


def interleaved(p: int, m: int, v: int) -> Schedule:
    """Interleaved 1F1B with v chunks per rank (Narayanan et al., SC 2021, section 2.2.2).

    Each chunk op takes 1/v of a stage's time, so the pipeline fills v times faster: idle
    fraction (p−1)/(v·m+p−1) when p divides m, for v times more point-to-point messages.
    With v = 1 this is exactly `one_f_one_b`.
    """
    check_sizes("interleaved", p, m, v)
    if m > p and m % p:
        raise ValueError(f"interleaved: m (micro-batches) = {m} must be a multiple of p = {p} "
                         f"or at most p, as in Megatron-LM (micro-batches go in groups of p); "
                         f"try m = {m - m % p} or {m + p - m % p}")
    total = m * v
    forwards, backwards = _interleaved_order(p, m, v, "F"), _interleaved_order(p, m, v, "B")
    stages = []
    for r in range(p):
        warmup = min(2 * (p - r - 1) + (v - 1) * p, total) if v > 1 else min(p - r - 1, m)
        row = forwards[:warmup]
        for k in range(total - warmup):
            row += [forwards[warmup + k], backwards[k]]
        row += backwards[total - warmup:]
        stages.append(tuple(row))
    return Schedule(tuple(stages), m=m, v=v, name="interleaved")


__all__ = ["LAYOUTS", "OP_KINDS", "Op", "Schedule", "as_op", "as_schedule", "gpipe",
           "interleaved", "naive", "one_f_one_b"]
