"""Judging helpers every lab shares: tolerances and messages that name the usual mistakes.

`compare_outputs` checks each rank's output against what it should be and, when it is wrong,
tries the mistakes students make most, in order, so the report can say *which* one:

* off by a factor of the world size (averaged instead of summed, or the reverse);
* equal to the rank's own input (no communication happened, or a new tensor was returned
  instead of writing in place);
* right on rank 0 (or the root) only: a reduce, not an all-reduce;
* the right chunks in the wrong order;
and otherwise names the first element that differs.

`unexplained_message` reads what the courier saw on the wire: every message of a collective
built from point-to-point carries, for one chunk of the split, the sum of some ranks' inputs
(a ring's partial sums, a tree's relayed root); a message that is no such sum (garbage of the
right size, sent to look like the algorithm) is named.
"""

from __future__ import annotations

import itertools
from typing import Sequence

import torch

from .lab import CaseResult, Verdict
from .sandbox.channel import FrameError, make_tensor
from .sandbox.courier import KEEP_BYTES

# Relative and absolute tolerances per dtype for sums of a few O(1) values in a different order
# than the reference (float64): a few ulps for float32/64, the 8-bit mantissa of bfloat16.
TOLERANCE = {torch.float64: (1e-9, 1e-9), torch.float32: (1e-5, 1e-5),
             torch.float16: (1e-2, 1e-2), torch.bfloat16: (2e-2, 5e-2)}


def close(got: torch.Tensor, want: torch.Tensor) -> bool:
    if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.dtype != want.dtype:
        return False
    rtol, atol = TOLERANCE.get(want.dtype, (0.0, 0.0))
    return torch.allclose(got.double(), want.double(), rtol=rtol, atol=atol)


def kept_input(op) -> torch.Tensor | None:
    """What a rank passed into a collective, as the courier kept it (`Op.data`, all inputs end
    to end), flat, in its own dtype; None when not kept (past KEEP_BYTES) or not readable."""
    kind = getattr(torch, str(op.dtype), None)
    if op.data is None or not isinstance(kind, torch.dtype):
        return None
    try:
        return make_tensor(op.dtype, [len(op.data) // kind.itemsize], op.data)
    except FrameError:
        return None


def in_blocks(values: torch.Tensor, blocks: list[torch.Tensor], same) -> list[int] | None:
    """`values` read as whole blocks back to back, each used once, in any order: the indices
    in the order found, until `values` or the blocks run out (what is left after them is not
    read); None when no unused block matches (`same(piece, block)`) where one must start.
    Greedy, O(len(blocks) · len(values)) comparisons at most: a flat buffer whose parameters a
    rank laid out in its own order (lab 02's buckets, lab 03's flat shards) is read back."""
    order, at, left = [], 0, list(range(len(blocks)))
    while left and at < values.numel():
        k = next((k for k in left if same(values[at:at + blocks[k].numel()], blocks[k])), None)
        if k is None:
            return None
        order.append(k)
        left.remove(k)
        at += blocks[k].numel()
    return order


def describe(got, want: torch.Tensor) -> str:
    """Where `got` first differs from `want`, in words: type, shape, dtype or the element."""
    if not isinstance(got, torch.Tensor):
        return f"expected a tensor, got {type(got).__name__}"
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    if got.dtype != want.dtype:
        return f"dtype {got.dtype}, expected {want.dtype}"
    diff = (got.double() - want.double()).abs().reshape(-1)
    i = int(diff.argmax())
    return (f"element {i} is {got.reshape(-1)[i].item():.6g}, expected "
            f"{want.reshape(-1)[i].item():.6g}")


def _mostly_different(got, want: torch.Tensor) -> bool:
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        return True
    rtol, atol = TOLERANCE.get(want.dtype, (0.0, 0.0))
    same = torch.isclose(got.double(), want.double(), rtol=rtol, atol=atol)
    return float(same.double().mean()) < 0.5


def chunk_permutation(got: torch.Tensor, want: torch.Tensor,
                      bounds: Sequence[tuple[int, int]]) -> bool:
    """Whether `got` holds `want`'s chunks in another order (chunk-aligned, equal sizes)."""
    if not isinstance(got, torch.Tensor) or got.shape != want.shape or len(bounds) < 2:
        return False
    g, w = got.reshape(-1).double(), want.reshape(-1).double()
    sizes = {b - a for a, b in bounds}
    if len(sizes) != 1 or 0 in sizes:
        return False
    chunks_w = [w[a:b] for a, b in bounds]
    used = set()
    for a, b in bounds:
        match = next((j for j, c in enumerate(chunks_w) if j not in used
                      and torch.allclose(g[a:b], c, rtol=1e-4, atol=1e-4)), None)
        if match is None:
            return False
        used.add(match)
    return not torch.allclose(g, w, rtol=1e-4, atol=1e-4)


def compare_outputs(outputs: Sequence, expected: Sequence[torch.Tensor], *, world_size: int,
                    inputs: Sequence | None = None, root: int | None = 0,
                    bounds: Sequence[tuple[int, int]] | None = None, what: str = "the result",
                    case: str = "") -> Verdict:
    """One verdict for a case: every rank's output against its expected tensor."""
    wrong = [r for r in range(world_size) if not close(outputs[r], expected[r])]
    if not wrong:
        return Verdict(True)
    where = f" ({case})" if case else ""
    r = wrong[0]
    got, want = outputs[r], expected[r]
    if isinstance(got, torch.Tensor) and got.shape == want.shape and got.dtype == want.dtype:
        if world_size > 1 and all(
                isinstance(outputs[q], torch.Tensor) and outputs[q].shape == expected[q].shape
                and close(outputs[q] * world_size, expected[q]) for q in wrong):
            return Verdict(False, f"{what} is the sum divided by the world size ({world_size}) "
                                  f"on rank {r}{where}: averaged instead of summed?")
        if world_size > 1 and all(
                isinstance(outputs[q], torch.Tensor) and outputs[q].shape == expected[q].shape
                and close(outputs[q], expected[q] * world_size) for q in wrong):
            return Verdict(False, f"{what} is {world_size}× too large on rank {r}{where}: "
                                  "added a chunk more than once?")
        if root is not None and root not in wrong and world_size > 1 \
                and len(wrong) == world_size - 1 and all(_mostly_different(outputs[q], expected[q])
                                                         for q in wrong):
            return Verdict(False, f"{what} is right only on rank {root}{where}: that is a reduce "
                                  "(or a gather), not an all-reduce: every rank must end with it")
        if inputs is not None and all(
                isinstance(outputs[q], torch.Tensor) and isinstance(inputs[q], torch.Tensor)
                and outputs[q].shape == inputs[q].shape and torch.equal(outputs[q], inputs[q])
                for q in wrong):
            return Verdict(False, f"{what} on rank {r}{where} is still the rank's own input: no "
                                  "communication happened, or a new tensor was returned instead "
                                  "of writing into the one passed in (in place)")
        if bounds is not None and chunk_permutation(got, want, bounds):
            return Verdict(False, f"{what} on rank {r}{where} holds the right chunks in the wrong "
                                  "order: chunk i belongs at positions chunk_bounds[i]")
    return Verdict(False, f"{what} is wrong on rank{'s' if len(wrong) > 1 else ''} "
                          f"{', '.join(map(str, wrong))}{where}: on rank {r}, "
                          f"{describe(got, want)}")


__all__ = ["TOLERANCE", "chunk_permutation", "close", "compare_outputs", "describe", "in_blocks",
           "unexplained_message"]


def _sums(flats: list[torch.Tensor], a: int, b: int,
          sets) -> list[tuple[tuple[int, ...], torch.Tensor]]:
    return [(s, sum(flats[i][a:b] for i in s)) for s in sets]


def unexplained_message(r: CaseResult, bounds: Sequence[tuple[int, int]], *,
                        sets: Sequence[Sequence[int]] | None = None,
                        case: str = "", split: str = "the lab's chunk_bounds") -> Verdict | None:
    """A failed verdict for the first message (as the courier saw it) whose values are not,
    for any chunk ``bounds[j]``, the sum of the inputs of one of `sets` of ranks (default:
    every non-empty set); None when every message is explained. A message whose bytes the
    courier did not keep (its per-launch keep limit was spent, e.g. by traffic outside the
    checked calls) fails too: a check that cannot see a message's values cannot pass it."""
    p = r.world_size
    flats = [x.reshape(-1).double() for x in r.inputs]
    sets = sets or [s for k in range(1, p + 1) for s in itertools.combinations(range(p), k)]
    rtol, atol = TOLERANCE.get(r.inputs[0].dtype, (0.0, 0.0))
    for rank, traffic in enumerate(r.traffic):
        for k, op in enumerate(traffic.sends):
            if not op.nbytes:
                continue
            if op.data is None:
                return Verdict(False, f"rank {rank}'s message {k + 1} (to rank {op.peer}) could "
                                      "not be checked: the ranks had sent more than the courier "
                                      f"keeps per launch ({KEEP_BYTES >> 20} MiB) before it"
                                      f"{f' ({case})' if case else ''}. Send only what the "
                                      "collective needs, and nothing when the module is imported.")
            try:
                got = make_tensor(op.dtype, list(op.shape), op.data).reshape(-1).double()
            except FrameError:
                continue
            for a, b in bounds:
                if b - a != got.numel():
                    continue
                if any(torch.allclose(got, want, rtol=rtol * 10, atol=atol * 10 * len(s))
                       for s, want in _sums(flats, a, b, sets)):
                    break
            else:
                where = f" ({case})" if case else ""
                return Verdict(False, f"rank {rank}'s message {k + 1} (to rank {op.peer}, "
                                      f"{got.numel():,} values) is neither a chunk of an input "
                                      "nor a partial sum of the inputs over one chunk, with "
                                      f"chunks as {split} cuts the tensor{where}. Each message "
                                      "is compared with those: cut the tensor that way, and "
                                      "send each chunk (or its running sum) as one message")
    return None
