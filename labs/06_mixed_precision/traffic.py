"""Lab 06's contents judges: what each all-reduce carried, as the grader's courier kept it
(`Op.data`, read with `feedback.kept_input`), against values computed here in float64 from the
grader's own inputs and reference trajectory (`expected.local_gradients`).

Counts, bytes and dtypes (checks.py) say that an all-reduce had the right size, not that it
carried anything: red team 8 all-reduced bf16 zeros of exactly 2Ψ bytes and a zero flag, moved
the gradients and flags between ranks through futexes on a library file every rank maps, and
scored 100. The seccomp filter now refuses shared futex wakes, but the kernel's own shared wake
when a thread exits (its clear-tid address, set by ``clone(CLONE_CHILD_CLEARTID)`` or
``set_tid_address``, may lie in a shared file mapping) is out of any filter's reach. So, as labs
02, 03, 05 and 07 do, every all-reduce must carry the rank's own contribution, which only its
own data can make, and the courier's sum of those is all another rank learns:

* a gradient all-reduce carries the rank's gradients as its backward left them: in training,
  its own mean squared error's gradient times the loss scale, at the reference's weights; in
  all_reduce_gradients' cases, its own gradients in bf16. Each parameter's gradient is one
  whole block, in any order, times 1 or 1/p (divided before the sum; 1/s or 1/(s·p) too,
  unscaled first), within `TOLERANCE` of the step's largest gradient (bf16 rounding, as
  accumulated by a bf16 forward and backward: a correct rank's stays under half of it,
  tests/test_lab06_contents.py). At most `FLAG_BYTES` more may ride along (the flag). A step's
  parameters may come in several all-reduces (the byte checks name that mistake): every one
  of them must be carried at that step. A rank whose loss overflowed at a step has no finite
  gradient to compare: its all-reduces there must say so (an inf or NaN in them, or a flag);
* a flag (an all-reduce of at most FLAG_BYTES carrying no gradient, or what rides beside the
  gradients) says whether the rank found an inf or NaN: in one of `CONVENTIONS`, the same for
  the whole case. unscale_ called alone knows its own gradients only: the rank holding the inf
  says "found", the others "none". In training the flag may be taken before the gradient
  all-reduce (its own gradients) or after it (the sum, where an inf anywhere shows): at a step
  with an injected overflow the rank that overflowed says "found" and the others either; at a
  step without one, every rank says "none". A flag of zeros whatever happens says nothing.

Steps are told apart by the harness's ``step{t}`` sections (the rank's word): a gradient is
matched by its contents to the step whose gradient it is, so a forged mark moves nothing; a
flag is read as its section's step, and a flag in no step cannot speak of any.
"""

from __future__ import annotations

import sys
from typing import Callable

import torch

from autograder.feedback import describe, kept_input
from autograder.lab import CaseResult, Verdict
from autograder.protocol import Op

ex = sys.modules["_autograder_lab_06_expected"]  # expected.py: checks.py loads it just before

FLAG_BYTES = 16
"""The inf/NaN flag's bytes, in an all-reduce of its own or riding in the gradients' bf16 buffer:
one number of any dtype, or two float64s (inf and NaN apart)."""

TOLERANCE = 2.0 ** -5
"""A gradient block's largest difference from the grader's float64 value, as a fraction of the
step's largest gradient (times the factor it was sent with)."""

MOST_PER_STEP = 8
"""All-reduces a rank may make per training step before its contents are not even read."""

CONVENTIONS: dict[str, Callable[[torch.Tensor], bool]] = {
    "nonzero when found (0/1, a bool, two float64s)": lambda v: bool((v != 0).any()),
    "an inf or NaN when found": lambda v: not bool(torch.isfinite(v).all()),
    "zero when found (an all-finite flag, combined with MIN)": lambda v: bool((v == 0).any()),
}
"""How a flag may say "found" (v: its values in float64)."""


def _values(op: Op) -> torch.Tensor | None:
    got = kept_input(op)
    return None if got is None else got.double()


def _unkept(rank: int, op: Op, n: int) -> Verdict:
    return Verdict(False, f"rank {rank}'s all-reduce {n + 1} ({op.nbytes:,} bytes of {op.dtype}) "
                          "could not be checked: the courier kept no copy of its bytes (the "
                          "ranks had sent more than it keeps per launch before it)")


def _blocks(got: torch.Tensor, pieces: list[torch.Tensor], factors: list[float],
            extra: int) -> tuple[list[int], torch.Tensor] | None:
    """The pieces `got` carries as whole blocks back to back (any order, each once, all times
    one of `factors`), from its first element or after at most `extra` leading ones, with at
    most `extra` elements besides them: (the pieces' indices, those other elements); None
    when no piece is there."""
    if not min(p.numel() for p in pieces) <= got.numel() <= sum(p.numel() for p in pieces) + extra:
        return None  # no piece fits, or more than every piece and a flag: nothing to compare
    big = max(float(p.abs().max()) for p in pieces)
    for c in factors:
        def same(part: torch.Tensor, want: torch.Tensor, c: float = c) -> bool:
            # `not ... > tol` would let NaN through: every comparison with NaN is False
            return part.shape == want.shape and float((part - c * want).abs().max()) <= \
                TOLERANCE * c * big
        for lead in range(min(extra, got.numel()) + 1):
            order, at, left = [], lead, list(range(len(pieces)))
            while left:
                k = next((k for k in left if same(got[at:at + pieces[k].numel()], pieces[k])),
                         None)
                if k is None:
                    break
                order.append(k)
                left.remove(k)
                at += pieces[k].numel()
            rest = torch.cat([got[:lead], got[at:]])
            if order and rest.numel() <= extra:
                return order, rest
    return None


def _factors(p: int, scale: float = 1.0) -> list[float]:
    return [1.0, 1.0 / p] + ([1.0 / scale, 1.0 / (scale * p)] if scale != 1 else [])


def _extra(op: Op) -> int:
    """How many elements of `op`'s dtype a flag riding in it may take."""
    size = getattr(torch, str(op.dtype), torch.uint8).itemsize
    return FLAG_BYTES // size


def judge_flags(r: CaseResult, seen: dict[tuple[int, int], torch.Tensor],
                says: Callable[[int, int], bool | None]) -> Verdict | None:
    """Whether every flag in `seen` ((rank, step) → its values) says what `says(rank, step)`
    requires (True: found, False: none, None: either) in one of `CONVENTIONS`; a failed
    verdict naming the first that does not, in the README's convention, otherwise None."""
    asked = [(key, v, says(*key)) for key, v in sorted(seen.items())]
    asked = [(key, v, want) for key, v, want in asked if want is not None]
    if not asked or any(all(rule(v) == want for _, v, want in asked)
                        for rule in CONVENTIONS.values()):
        return None
    rule = next(iter(CONVENTIONS.values()))
    (rank, step), v, want = next(a for a in asked if rule(a[1]) != a[2])
    where = f" at step {step}" if r.case["kind"] == "train" else ""
    why = ("its own gradients held an inf or NaN there" if want else
           "no rank's gradients held one there")
    return Verdict(False, f"rank {rank}'s inf/NaN flag{where} was {v.tolist()}, which says "
                          f"{'none' if want else 'found'}, though {why} (read as 1 = found, or "
                          "as any other convention held over the whole case). The flag must "
                          "carry this rank's own answer, so that the all-reduce combines them")


def judge_reduce_contents(r: CaseResult) -> Verdict | None:
    """all_reduce_gradients' one all-reduce per rank carries that rank's own bf16 gradients
    (every parameter that has one, any order), or them over p."""
    none = r.case.get("none")
    for rank, traffic in enumerate(r.traffic):
        pieces = [g.to(torch.bfloat16).double().reshape(-1)
                  for k, g in enumerate(r.inputs[rank]["g"]) if k != none]
        for n, op in enumerate(o for o in traffic.ops if o.op == "all_reduce"):
            got = _values(op)
            if got is None:
                return _unkept(rank, op, n)
            found = _blocks(got, pieces, _factors(r.world_size), 0)
            if found is None or len(found[0]) != len(pieces):
                mine = torch.cat(pieces)
                said = describe(got, mine) if got.shape == mine.shape else \
                    f"{got.numel()} values for {mine.numel()} gradient elements"
                return Verdict(False, f"rank {rank}'s all-reduce carried something other than "
                                      f"its own gradients ({said}): each rank all-reduces its "
                                      "own .grad values, flattened in bf16 (or divided by the "
                                      f"world size first) ({r.world_size} ranks)")
    return None


def judge_unscale_contents(r: CaseResult) -> Verdict | None:
    """unscale_'s flag says whether this rank's own gradients hold the inf or NaN."""
    bad = r.case.get("bad")
    seen = {}
    for rank, traffic in enumerate(r.traffic):
        for n, op in enumerate(o for o in traffic.ops if o.op == "all_reduce" and o.nbytes):
            got = _values(op)
            if got is None:
                return _unkept(rank, op, n)
            seen[rank, 0] = got
    return judge_flags(r, seen, lambda rank, _: bad is not None and bad[0] == rank)


def _step_of(traffic, steps: int) -> dict[int, int]:
    """id of each op → the step whose ``step{t}`` section holds it."""
    return {id(op): t for t in range(steps) for op in traffic.section(f"step{t}").ops}


def _step_carried(got: torch.Tensor, want: list, home: int | None, factors: list,
                  extra: int) -> tuple[int, tuple[list[int], torch.Tensor]] | None:
    """(the step whose gradients `got` carries, `_blocks`' answer), trying its own section's
    step first; None when it carries no step's."""
    for t in ([home] if home is not None else []) + [t for t in range(len(want)) if t != home]:
        hit = _blocks(got, want[t], factors[t], extra) if want[t] is not None else None
        if hit is not None:
            return t, hit
    return None


def judge_train_contents(r: CaseResult) -> Verdict | None:
    """Every all-reduce of a training case carries its rank's gradients of one step, or a flag
    (module docstring); every step's gradients, each parameter's, are carried."""
    c, p = r.case, r.world_size
    steps, overflow = c["steps"], {tuple(o) for o in c.get("overflow", [])}
    scale = [float(c["init_scale"])] + ex.scales(c, ex.skipped(c))
    seen: dict[tuple[int, int], torch.Tensor] = {}
    for rank, traffic in enumerate(r.traffic):
        want = ex.local_gradients(r, rank)
        step_of, carried = _step_of(traffic, steps), {t: set() for t in range(steps)}
        said = set()  # steps at which this rank's all-reduces held an inf or NaN
        ops = [o for o in traffic.ops if o.op == "all_reduce" and o.nbytes]
        if len(ops) > MOST_PER_STEP * steps:  # counts before contents: a judge stays linear
            return Verdict(False, f"rank {rank} made {len(ops)} all-reduces in {steps} steps; a "
                                  "step needs one for its gradients and at most one for the "
                                  f"inf/NaN flag ({p} ranks)")
        for n, op in enumerate(ops):
            got, home = _values(op), step_of.get(id(op))
            if got is None:
                return _unkept(rank, op, n)
            match = _step_carried(got, want, home, [_factors(p, s) for s in scale], _extra(op))
            if match is not None:
                t, (blocks, rest) = match
                carried[t].update(blocks)
                if rest.numel():
                    seen[rank, t] = torch.cat([seen.get((rank, t), rest[:0]), rest])
                continue
            if home is not None and (home, rank) in overflow and op.nbytes > FLAG_BYTES:
                said.update([home] if not bool(torch.isfinite(got).all()) else [])
                continue  # its gradients there are not finite: nothing to compare
            if op.nbytes <= FLAG_BYTES and home is not None:
                seen[rank, home] = torch.cat([seen.get((rank, home), got[:0]), got])
                continue
            return _not_gradients(r, rank, n, op, got, home, want[home or 0])
        for t in range(steps):
            if want[t] is not None and len(carried[t]) < len(want[t]):
                return Verdict(False, f"rank {rank}'s all-reduces of step {t} did not carry its "
                                      f"{'weight' if 0 not in carried[t] else 'bias'} gradient: "
                                      "every step all-reduces every gradient this rank's "
                                      f"backward computed ({p} ranks)")
            if (t, rank) in overflow and t not in said and (rank, t) not in seen:
                return Verdict(False, f"rank {rank}'s loss overflowed at step {t}, and none of "
                                      "its all-reduces there said so (no inf or NaN in them, "
                                      f"no flag): the other ranks cannot know to skip ({p} "
                                      "ranks)")
    return judge_flags(r, seen, lambda rank, t: True if (t, rank) in overflow else
                       None if any(s == t for s, _ in overflow) else False)


def _not_gradients(r: CaseResult, rank: int, n: int, op: Op, got: torch.Tensor,
                   home: int | None, want: list[torch.Tensor] | None) -> Verdict:
    if home is None and op.nbytes <= FLAG_BYTES:
        return Verdict(False, f"rank {rank}'s all-reduce {n + 1} ({op.nbytes} bytes of "
                              f"{op.dtype}) was made outside train_step, where no step's "
                              "inf/NaN flag belongs, and carries no gradient "
                              f"({r.world_size} ranks)")
    mine = torch.cat(want) if want is not None else None
    said = f": {describe(got[:mine.numel()], mine)} (its scaled gradient, before the sum)" \
        if mine is not None and got.numel() >= mine.numel() else ""
    step = f" in step {home}" if home is not None else ""
    return Verdict(False, f"rank {rank}'s all-reduce {n + 1}{step} ({op.nbytes:,} bytes of "
                          f"{op.dtype}) carried neither its gradients of a step nor an inf/NaN "
                          f"flag{said}. Each gradient all-reduce carries this rank's own "
                          "gradients as its scaled backward left them (in bf16; or divided by "
                          f"the world size), each parameter's whole ({r.world_size} ranks)")


__all__ = ["CONVENTIONS", "FLAG_BYTES", "MOST_PER_STEP", "TOLERANCE", "judge_flags",
           "judge_reduce_contents", "judge_train_contents", "judge_unscale_contents"]
