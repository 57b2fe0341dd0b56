"""Pipeline schedules as plain data: for every stage (rank), the ordered list of its ops.

An op is the forward ``F`` or the backward ``B`` of one micro-batch on one model chunk. A stage
runs its list top to bottom; an op that needs another stage's output waits for that message.
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

Text form: ``"F3"`` is the forward of micro-batch 3 (chunk 0), ``"B3.1"`` the backward of
micro-batch 3 on chunk 1. `as_schedule` turns lists of such strings (or ``(kind, mb, chunk)``
tuples) into a `Schedule`, so a student's schedule function can return plain lists.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from ..cost.bubble import check_sizes

NAMES = ("naive", "gpipe", "1f1b", "interleaved")
"""Schedule names `make_schedule` knows."""

_TEXT = re.compile(r"^\s*([FBfb])\s*(\d+)(?:\.(\d+))?\s*$")


@dataclass(frozen=True, order=True)
class Op:
    """One step of a stage: the forward (``"F"``) or backward (``"B"``) of micro-batch `mb` on
    model chunk `chunk` (0 unless the schedule is interleaved)."""

    kind: str
    """``"F"`` or ``"B"``."""
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
            raise ValueError(f"cannot read op {item!r}: write 'F<micro-batch>' or "
                             f"'B<micro-batch>', with '.<chunk>' for an interleaved chunk "
                             f"(e.g. 'F3', 'B0.1')")
        kind, mb, chunk = match.groups()
        return Op(kind.upper(), int(mb), int(chunk or 0))
    if isinstance(item, (tuple, list)) and len(item) in (2, 3):
        try:
            return Op(str(item[0]).upper(), int(item[1]), int(item[2]) if len(item) == 3 else 0)
        except (TypeError, ValueError):
            pass
    raise ValueError(f"cannot read op {item!r}: expected an Op, a string like 'F3' or a tuple "
                     f"('F', micro-batch[, chunk])")


@dataclass(frozen=True)
class Schedule:
    """Per stage, the ordered ops it runs: ``schedule.stages[r]`` is rank r's list."""

    stages: tuple[tuple[Op, ...], ...]
    """One tuple of ops per stage (rank), in the order the stage runs them."""
    m: int
    """Number of micro-batches."""
    v: int = 1
    """Model chunks per rank (virtual stages per rank); 1 except for interleaved schedules."""
    name: str = "custom"
    """Where it came from: one of `NAMES`, or ``"custom"``."""

    @property
    def p(self) -> int:
        """Number of stages (ranks)."""
        return len(self.stages)

    def __getitem__(self, stage: int) -> tuple[Op, ...]:
        return self.stages[stage]

    def __len__(self) -> int:
        return len(self.stages)

    def __str__(self) -> str:
        return "\n".join(f"stage {r}: " + " ".join(map(str, ops))
                         for r, ops in enumerate(self.stages))

    def virtual_stage(self, stage: int, chunk: int) -> int:
        """Position of (rank `stage`, chunk `chunk`) in the model: chunk·p + stage (Megatron)."""
        return chunk * self.p + stage

    def place(self, virtual: int) -> tuple[int, int]:
        """(rank, chunk) that holds virtual stage `virtual`."""
        return virtual % self.p, virtual // self.p


def as_schedule(stages: Schedule | Iterable[Iterable[Op | str | Sequence]], *,
                m: int | None = None, v: int | None = None, name: str = "custom") -> Schedule:
    """A `Schedule` from per-stage lists of ops (`Op`, ``"F3"``, ``("B", 3)``, …).

    m and v default to what the ops mention (largest micro-batch + 1, largest chunk + 1); pass
    them when grading, so a schedule that forgets the last micro-batch is caught.
    """
    if isinstance(stages, Schedule):
        if m is None and v is None:
            return stages
        stages, name = stages.stages, stages.name
    rows = tuple(tuple(as_op(item) for item in row) for row in stages)
    ops = [op for row in rows for op in row]
    m = m if m is not None else (max((op.mb for op in ops), default=-1) + 1)
    v = v if v is not None else (max((op.chunk for op in ops), default=0) + 1)
    return Schedule(rows, m=m, v=v, name=name)


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


def make_schedule(name: str, *, p: int, m: int = 1, v: int = 1) -> Schedule:
    """The schedule called `name` (one of `NAMES`) for p stages, m micro-batches, v chunks."""
    key = str(name).lower().replace("-", "").replace("_", "")
    if key not in NAMES:
        raise ValueError(f"make_schedule: unknown schedule {name!r}; choose one of {NAMES}")
    if key != "interleaved" and v != 1:
        raise ValueError(f"make_schedule: v (chunks per rank) = {v} needs the 'interleaved' "
                         f"schedule; {name!r} runs one chunk per rank, pass v=1")
    if key == "naive":
        if m != 1:
            raise ValueError(f"make_schedule: naive model parallel runs the whole batch as one "
                             f"micro-batch; pass m=1 (got m={m}), or use 'gpipe' to split it")
        return naive(p)
    if key == "gpipe":
        return gpipe(p, m)
    if key == "1f1b":
        return one_f_one_b(p, m)
    return interleaved(p, m, v)


__all__ = ["NAMES", "Op", "Schedule", "as_op", "as_schedule", "gpipe", "interleaved",
           "make_schedule", "naive", "one_f_one_b"]
