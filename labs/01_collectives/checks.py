"""Lab 01's visible checks (students have these) and the judges the hidden ones reuse.

Judges run in the grader: expected values are computed in float64 from the inputs the grader
made and sent to each rank (`harness.make_inputs`, from the grade's secret), and traffic is what
the grader's courier saw: counts, bytes, and each message's values, which must be a chunk or a
partial sum of the ranks' inputs (`feedback.unexplained_message`). The counts (Thakur,
Rabenseifner & Gropp, IJHPCA 2005; `toolkit.cost.models`): ring all-reduce 2(p−1) messages,
2(p−1)/p·X bytes per rank; ring reduce-scatter / all-gather p − 1 messages, (p−1)/p·X;
binomial-tree broadcast ⌈log₂ p⌉ sends at most per rank, every other rank receiving X once.
"""

from __future__ import annotations

import itertools
import math

import torch

from _lab_harness import chunk_bounds  # the lab's harness.py (loaded under this name)
from autograder.feedback import compare_outputs, unexplained_message
from autograder.lab import CaseResult, Check, LabInfo, Verdict
from autograder.outputs import Tensor

LAB = LabInfo(
    slug="01_collectives",
    title="Lab 01: collectives from point-to-point",
    student_files=("collectives.py",),
    names=("ring_all_reduce", "tree_broadcast", "ring_reduce_scatter", "ring_all_gather"),
    forbidden_imports=("toolkit.collectives",),
)


def _whole(case: dict, inputs: torch.Tensor, rank: int, world_size: int) -> Tensor:
    return Tensor.like(inputs)  # the harness's own tensor, written in place


def _chunk(case: dict, inputs: torch.Tensor, rank: int, world_size: int) -> Tensor:
    a, b = chunk_bounds(inputs.numel(), world_size)[rank]
    return Tensor((b - a,), Tensor.like(inputs).dtypes)


def _flat(case: dict, inputs: torch.Tensor, rank: int, world_size: int) -> Tensor:
    return Tensor((inputs.numel(),), Tensor.like(inputs).dtypes)


# What each call's harness returns (`autograder.outputs`), checked before any judge reads it.
OUTPUTS = {"all_reduce": _whole, "broadcast": _whole, "reduce_scatter": _chunk,
           "all_gather": _flat}


def cases(world_sizes, numels, dtypes=("float32",), seed: int = 0, **extra) -> tuple[dict, ...]:
    """Every combination, each with its own seed so inputs differ between cases."""
    out = []
    for k, (p, n, d) in enumerate(itertools.product(world_sizes, numels, dtypes)):
        case = {"world_size": p, "dtype": d, "seed": seed + k, **extra}
        case.update({"shape": list(n)} if isinstance(n, tuple) else {"numel": n})
        out.append(case)
    return tuple(out)


def _label(r: CaseResult) -> str:
    size = r.case.get("shape") or r.case.get("numel")
    return f"{r.world_size} ranks, {size} elements of {r.case.get('dtype', 'float32')}"


def _sum(r: CaseResult) -> torch.Tensor:
    return torch.stack([x.double() for x in r.inputs]).sum(0).to(r.inputs[0].dtype)


def judge_all_reduce(r: CaseResult) -> Verdict:
    total = _sum(r)
    n = total.numel()
    bounds = chunk_bounds(n, r.world_size)
    return compare_outputs(r.outputs, [total] * r.world_size, world_size=r.world_size,
                           inputs=r.inputs, root=0, bounds=bounds, what="the all-reduced tensor",
                           case=_label(r))


def judge_broadcast(r: CaseResult) -> Verdict:
    src = r.case.get("src", 0) % r.world_size
    return compare_outputs(r.outputs, [r.inputs[src]] * r.world_size, world_size=r.world_size,
                           inputs=r.inputs, root=None, what=f"the tensor broadcast from rank {src}",
                           case=_label(r))


def judge_reduce_scatter(r: CaseResult) -> Verdict:
    total, p = _sum(r).reshape(-1), r.world_size
    bounds = chunk_bounds(total.numel(), p)
    want = [total[a:b] for a, b in bounds]
    verdict = compare_outputs(r.outputs, want, world_size=p, root=None,
                              what="the reduce-scattered chunk", case=_label(r))
    if not verdict.passed:  # name the common slip: a complete chunk, but another rank's
        for rank, got in enumerate(r.outputs):
            for j, chunk in enumerate(want):
                if j != rank and isinstance(got, torch.Tensor) and got.shape == chunk.shape \
                        and got.numel() \
                        and torch.allclose(got.double(), chunk.double(), 1e-4, 1e-4):
                    return Verdict(False, f"rank {rank} holds chunk {j} of the sum; rank {rank} "
                                          f"should end with chunk {rank} ({_label(r)}): check "
                                          "which chunk each step sends")
    return verdict


def judge_all_gather(r: CaseResult) -> Verdict:
    p = r.world_size
    n = r.inputs[0].numel()
    bounds = chunk_bounds(n, p)
    want = torch.cat([r.inputs[i].reshape(-1)[a:b] for i, (a, b) in enumerate(bounds)])
    return compare_outputs(r.outputs, [want] * p, world_size=p, root=None, bounds=bounds,
                           what="the gathered tensor", case=_label(r))


def _splits(n: int, p: int) -> tuple[list[tuple[int, int]], str]:
    """The chunks a correct all-reduce may cut n elements into, and how to name them: the
    lab's `chunk_bounds` (as torch.tensor_split), torch.chunk's (⌈n/p⌉ each, fewer at the end)
    and n // p each with the remainder in the last. The values check does not care, so the
    traffic check accepts all three."""
    size = -(-n // p)
    chunked = [(a, min(n, a + size)) for a in range(0, n, size)]
    base = n // p
    last = [(i * base, n if i == p - 1 else (i + 1) * base) for i in range(p)]
    bounds = list(dict.fromkeys(chunk_bounds(n, p) + chunked + last))
    return bounds, "chunk_bounds (torch.tensor_split), torch.chunk or n // p with the rest last"


def _traffic(r: CaseResult, *, messages: int, factor: int, what: str,
             any_split: bool = False) -> Verdict:
    """Each rank sends `messages` messages (when every chunk is non-empty) and `factor` chunks'
    worth of bytes: exactly factor·X/p when p divides n, and factor·X over all ranks.
    `any_split`: messages may follow any of `_splits` (an all-reduce's output does not show how
    it was cut); otherwise `chunk_bounds` (the output of reduce-scatter and all-gather does)."""
    p, x0 = r.world_size, r.inputs[0]
    n, size = x0.numel(), x0.element_size()
    sent = [t.bytes_sent for t in r.traffic]
    msgs = [t.messages_sent for t in r.traffic]
    want_total = factor * n * size
    lo, hi = factor * (n // p) * size, factor * math.ceil(n / p) * size
    problem = None
    if sum(sent) != want_total:
        problem = f"all ranks together sent {sum(sent):,} bytes; expected {want_total:,}"
    elif any(not lo <= s <= hi for s in sent):
        rank = next(i for i, s in enumerate(sent) if not lo <= s <= hi)
        problem = f"rank {rank} sent {sent[rank]:,} bytes; expected {lo:,}" + (
            f" to {hi:,}" if hi != lo else "")
    elif n >= p and any(m != messages for m in msgs):
        rank = next(i for i, m in enumerate(msgs) if m != messages)
        problem = f"rank {rank} sent {msgs[rank]} messages; expected {messages}"
    problem = problem or _ring_problem(r, lo, hi)
    if problem:
        return Verdict(False, f"{problem} ({_label(r)}). {what}")
    bounds, split = _splits(n, p) if any_split else (chunk_bounds(n, p), "chunk_bounds")
    return unexplained_message(r, bounds, case=_label(r), split=split) or Verdict(True)


def _ring_problem(r: CaseResult, lo: int, hi: int) -> str | None:
    """What makes this traffic no ring, or None: in a ring every rank receives as many bytes as
    it sends (lo..hi), and in each phase (the first p − 1 messages of a rank, then the next
    p − 1 for an all-reduce's all-gather) it sends to one neighbour and receives from the other,
    and following "sends to" from rank 0 visits every rank once before coming back (one cycle
    of length p; either direction, any order of ranks, the two phases may differ). Counts alone
    cannot tell a ring from a star whose hub relays as many messages: these per-peer facts
    can. Message counts are checked before (p − 1 per phase)."""
    p = r.world_size
    if p < 3:  # at p = 2 every exchange is between the only two ranks: any pattern is a ring
        return None
    for rank, t in enumerate(r.traffic):
        if not lo <= t.bytes_received <= hi:
            return (f"rank {rank} received {t.bytes_received:,} bytes; a ring rank receives "
                    f"as much as it sends ({lo:,}" + (f" to {hi:,})" if hi != lo else ")"))
    phases = max(1, len(r.traffic[0].sends) // (p - 1))
    for phase in range(phases):
        part = slice(phase * (p - 1), (phase + 1) * (p - 1))
        which = f" in phase {phase + 1}" if phases > 1 else ""
        to = {}
        for rank, t in enumerate(r.traffic):
            dsts = sorted({o.peer for o in t.sends[part]})
            srcs = sorted({o.peer for o in t.receives[part]})
            if len(dsts) != 1 or len(srcs) != 1:
                return (f"rank {rank} sent to ranks {dsts} and received from ranks {srcs}"
                        f"{which}; in a ring each rank sends to one neighbour and receives "
                        "from the other only")
            to[rank] = dsts[0]
        seen, rank = [], 0
        while rank not in seen:
            seen.append(rank)
            rank = to[rank]
        if len(seen) != p:
            return (f"the ranks' messages{which} go round {' → '.join(map(str, seen + [rank]))} "
                    f"without visiting all {p} ranks; a ring is one cycle through every rank")
    return None


def judge_ring_traffic(r: CaseResult) -> Verdict:
    values = judge_all_reduce(r)
    if not values.passed:
        return values
    p = r.world_size
    return _traffic(r, messages=2 * (p - 1), factor=2 * (p - 1), any_split=True,
                    what=f"A ring all-reduce sends 2(p−1) = {2 * (p - 1)} messages of one chunk "
                         f"each, 2(p−1)/p·X bytes per rank.")


def judge_tree_traffic(r: CaseResult) -> Verdict:
    values = judge_broadcast(r)
    if not values.passed:
        return values
    p, src, x = r.world_size, r.case.get("src", 0) % r.world_size, r.inputs[0]
    nbytes, rounds = x.numel() * x.element_size(), math.ceil(math.log2(p)) if p > 1 else 0
    for rank, t in enumerate(r.traffic):
        if rank != src and (t.messages_received, t.bytes_received) != (1, nbytes):
            return Verdict(False, f"rank {rank} received {t.messages_received} messages "
                                  f"({t.bytes_received:,} bytes); in a broadcast every rank "
                                  f"but the root receives the tensor exactly once ({_label(r)})")
        if t.messages_sent > rounds:
            return Verdict(False, f"rank {rank} sent {t.messages_sent} messages; in a binomial "
                                  f"tree no rank sends more than ⌈log₂ {p}⌉ = {rounds} "
                                  f"({_label(r)}). One root sending to everyone is a linear "
                                  "broadcast, not a tree.")
    latest = _tree_rounds(r, src)
    if latest > rounds:
        return Verdict(False, f"the last rank got the tensor in round {latest}; a binomial tree "
                              f"reaches every rank in ⌈log₂ {p}⌉ = {rounds} rounds "
                              f"({_label(r)}). A rank's k-th send happens in round (the round "
                              "it received in) + k: every rank that has the data should send "
                              "it on in every round, not a chain (root → root+1 → …) or a few "
                              "ranks fanning out one after another.")
    return unexplained_message(r, [(0, x.numel())], sets=[(src,)], case=_label(r)) \
        or Verdict(True)


def _tree_rounds(r: CaseResult, src: int) -> int:
    """The round in which the last rank received, on the binomial tree's clock: the root has
    the data at round 0, and a rank that received in round t makes its k-th send (in the order
    the courier saw its sends) in round t + k, at the earliest, since one rank sends one message
    at a time. Depth alone misses a rank fanning out to many children one after another.
    Every non-root received exactly once (checked before); a cycle counts as later than any
    tree."""
    p = r.world_size
    parent = {rank: t.receives[0].peer for rank, t in enumerate(r.traffic) if rank != src}
    order = {(rank, o.peer): k + 1 for rank, t in enumerate(r.traffic)
             for k, o in enumerate(t.sends)}
    got = {src: 0}

    def round_of(rank: int, seen: int = 0) -> int:
        if rank not in got:
            up = parent.get(rank, src)
            got[rank] = p * p if seen > p else round_of(up, seen + 1) + order.get((up, rank), 1)
        return got[rank]

    return max((round_of(rank) for rank in parent), default=0)


def judge_rs_traffic(r: CaseResult) -> Verdict:
    values = judge_reduce_scatter(r)
    if not values.passed:
        return values
    p = r.world_size
    return _traffic(r, messages=p - 1, factor=p - 1,
                    what=f"A ring reduce-scatter sends p−1 = {p - 1} messages, (p−1)/p·X bytes.")


def judge_ag_traffic(r: CaseResult) -> Verdict:
    values = judge_all_gather(r)
    if not values.passed:
        return values
    p = r.world_size
    x = r.inputs[0]
    chunked = CaseResult(r.case, p, r.inputs, r.outputs, r.traffic)
    return _traffic(chunked, messages=p - 1, factor=p - 1,
                    what=f"A ring all-gather sends p−1 = {p - 1} messages, (p−1)/p·X bytes "
                         f"(X = {x.numel() * x.element_size():,} bytes gathered).")


CHECKS = [
    Check("ring_all_reduce: every rank ends with the sum", 10, "all_reduce",
          cases((2, 3, 4), (8, 1001)), judge_all_reduce,
          about="Sizes that divide by p and sizes that do not, float32, 2-4 ranks."),
    Check("ring_all_reduce: 2(p−1) messages, 2(p−1)/p·X bytes per rank", 5, "all_reduce",
          cases((2, 4), (4096,), seed=20) + cases((3,), (1001,), seed=25),
          judge_ring_traffic,
          about="Seen by the grader's courier, values included; torch's built-in collectives "
                "are not allowed."),
    Check("tree_broadcast: every rank ends with the root's tensor", 7, "broadcast",
          cases((2, 3, 4), (100,), seed=30, src=0) + cases((3, 4), (100,), seed=40, src=1),
          judge_broadcast, about="Roots 0 and 1, 2-4 ranks."),
    Check("tree_broadcast: a binomial tree (no rank sends more than ⌈log₂ p⌉ messages)", 3,
          "broadcast", cases((4,), (64,), seed=50, src=0) + cases((4,), (64,), seed=51, src=3),
          judge_tree_traffic),
    Check("ring_reduce_scatter: rank i ends with chunk i of the sum", 7, "reduce_scatter",
          cases((2, 3, 4), (12, 10), seed=60), judge_reduce_scatter),
    Check("ring_all_gather: every rank ends with every chunk, in order", 8, "all_gather",
          cases((2, 3, 4), (12, 10), seed=70), judge_all_gather),
]
