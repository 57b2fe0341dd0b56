"""Lab 02's traffic judges: what the grader's courier saw each rank's all-reduces carry, over
the whole case.

The case's bounds are the courier's (it hands out the case and takes the output), so every
count is over the whole case, never between the harness's marks, which are the rank's word (a
red team's naive DDP posted decoy all-reduces in forward and forged ``sync{k}:end`` so that
its real per-parameter all-reduces fell in no section: 100/100). Per rank: broadcasts only
before training (``DDP.__init__``: before the first all-reduce and the first gate);
steps × B all-reduces of data (B buckets; barriers and zero-byte calls are not counted), the
t-th group of B being step t's; each carrying one bucket's gradient as the rank's backward left
it (`expected.local_gradients`, at the weights the rank says the step started from, so a
mistake in the values does not fail the traffic), its parameters in any order, or that over
p. Step t's synchronised backward asks gate t·k + k − 1 (k micro-batches a step), a fact of
the courier: an all-reduce it read before that gate overlapped with backward. Sections only
word a message (all-reduces "inside no_sync()"). Linear in what a rank sent: positions are
indexed once (`RankTraffic.position`), and each op is compared with the case's B buckets.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field

import torch

from _lab_harness import make_model  # the lab's harness.py
from autograder.feedback import describe, in_blocks, kept_input
from autograder.lab import CaseResult, Verdict
from autograder.protocol import Op
from toolkit.data_parallel.buckets import assign_buckets

ex = sys.modules["_autograder_lab_02_expected"]  # expected.py: checks.py loads it just before


@dataclass
class Step:
    """One step of one rank, from the courier's record."""

    all_reduces: list[Op]
    """Its B all-reduces of data, in the order the courier received them."""
    bucket: list[int] = field(default_factory=list)
    """Which bucket each one carried (by contents)."""
    gate: int | None = None
    """Position of the synchronised backward's gate among the rank's entries (None: not asked)."""
    end: int = 0
    """Position by which each all-reduce must have been waited on: the step's ``sync{t}:end``
    mark or the next step's first gate, whichever came first."""


def counted(ops) -> list[Op]:
    """The ops that move data: barriers are allowed anywhere, and a zero-byte collective
    carries nothing (counting it would let empty all-reduces stand in for buckets)."""
    return [o for o in ops if o.op != "barrier" and o.nbytes > 0]


def label(r: CaseResult) -> str:
    c = r.case
    bits = [f"{r.world_size} ranks", "TinyMLP" if c.get("model") == "mlp" else "toy model"]
    bits += ["tied weight"] if c.get("tied") else []
    bits += [f"frozen {', '.join(c['frozen'])}"] if c.get("frozen") else []
    bits += ["side branch used in step 0 only"] if c.get("side") else []
    bits += [f"bucket cap {c['cap']} bytes"] if "cap" in c else ["default bucket cap"]
    bits += [f"{c['accumulate']} micro-batches per step"] if c.get("accumulate", 1) > 1 else []
    return ", ".join(bits)


def _count_hint(r: CaseResult, rank: int, got: int) -> str:
    """The usual mistake behind `got` all-reduces in the case, as a sentence ("" if none)."""
    c, steps = r.case, int(r.case.get("steps", 3))
    params = ex.trainable(c)
    quiet = sum(len([o for o in counted(r.traffic[rank].section(f"quiet{t}").ops)
                     if o.op == "all_reduce"]) for t in range(steps))
    if quiet:
        return (f" {quiet} of them inside no_sync(), where forward+backward must send nothing "
                "(gradients accumulate locally)")
    if got == steps * len(params):
        return (" That is one per parameter: pack the gradients into buckets and all-reduce "
                "each bucket's flat buffer once")
    if got == steps * len(assign_buckets(params[::-1], int(c.get("cap", ex.DEFAULT_CAP)))):
        return (" That is the count of buckets filled in forward order: walk the parameters "
                "from the last to the first")
    if got == steps * len(ex.expected_buckets(c)) - (steps - 1) and c.get("side"):
        return (" A bucket that holds a parameter without gradient this step (the side branch "
                "after step 0) never fills: finish() must put zeros in its slot and start it")
    return " Check assign_buckets and that each bucket is all-reduced exactly once per step"


def bytes_hint(model: torch.nn.Module, nbytes: int) -> str:
    """The usual mistake that makes a step's all-reduces carry `nbytes` instead of the
    trainable parameters' bytes, as a sentence ("" when none explains it). Bytes are counted
    with each tensor's own element size; a tied weight is found as one tensor under several
    names."""
    def size(ps) -> int:
        return sum(p.numel() * p.element_size() for p in ps)

    trainable = size(p for p in model.parameters() if p.requires_grad)
    every = size(model.parameters())
    each_use = size(p for _, p in model.named_parameters(remove_duplicate=False)
                    if p.requires_grad)  # a tied weight once per module that holds it
    if nbytes == every != trainable:
        return " That is every parameter's bytes: frozen parameters were sent"
    if nbytes == each_use != trainable:
        return " The tied weight was sent twice: module.parameters() lists it once"
    return ""


def _carries(got: torch.Tensor | None, pieces: list[torch.Tensor], p: int) -> bool:
    """Whether `got` (an all-reduce's input) is one bucket's gradients, `pieces` (one flat
    tensor per parameter), back to back in any order, or all of that over p."""
    if got is None or got.numel() != sum(x.numel() for x in pieces):
        return False
    for c in (1.0, 1.0 / p):
        def same(piece, want, c=c):
            tol = 1e-6 + 1e-4 * float(want.abs().max()) if want.numel() else 0.0
            return piece.shape == want.shape and torch.allclose(piece, want * c, rtol=1e-4,
                                                                atol=c * tol)
        order = in_blocks(got, pieces, same)
        if order is not None and len(order) == len(pieces):
            return True
    return False


def rank_steps(r: CaseResult, rank: int) -> tuple[list[Step], Verdict | None]:
    """Rank `rank`'s steps from the courier's record of the whole case, each all-reduce matched
    to the bucket whose gradient it carried; or a failed verdict saying what does not add up
    (a late broadcast, the count, the bytes, the contents)."""
    c, t, at = r.case, r.traffic[rank], f"rank {rank} ({label(r)})"
    steps, k = int(c.get("steps", 3)), int(c.get("accumulate", 1))
    buckets, want_bytes = ex.expected_buckets(c), ex.bucket_bytes(c)
    n_buckets, ops = len(buckets), counted(t.ops)
    ars = [o for o in ops if o.op == "all_reduce"]
    starts = [t.position(x) for x in ars[:1] + t.gates[:1]]
    began = min(starts) if starts else math.inf
    late = [o for o in ops if o.op == "broadcast" and t.position(o) > began]
    if late:
        return [], Verdict(False, f"{at} called broadcast {len(late)} time(s) during training: "
                                  "DDP broadcasts in __init__ only (rank 0's weights), and each "
                                  "step moves its gradients by one all-reduce per bucket")
    if len(ars) != steps * n_buckets:
        return [], Verdict(False, f"{at}: {len(ars)} all-reduces in {steps} steps; the "
                                  f"{len(ex.trainable(c))} trainable parameters make "
                                  f"{n_buckets} bucket(s), one all-reduce each per step "
                                  f"({steps * n_buckets} in all).{_count_hint(r, rank, len(ars))}")
    model, trainable_bytes = make_model(c, 0), sum(want_bytes)
    out = []
    for step in range(steps):
        group = ars[step * n_buckets:(step + 1) * n_buckets]
        nbytes = sum(o.nbytes for o in group)
        if nbytes != trainable_bytes:
            return [], Verdict(False, f"{at}, step {step}: the all-reduces carried {nbytes:,} "
                                      f"bytes; the trainable parameters hold "
                                      f"{trainable_bytes:,}.{bytes_hint(model, nbytes)}")
        got_each = sorted(o.nbytes for o in group)
        if got_each != sorted(want_bytes):
            return [], Verdict(False, f"{at}, step {step}: the all-reduces carried {got_each} "
                                      f"bytes (sorted); the buckets hold {sorted(want_bytes)}. "
                                      "Each all-reduce carries one whole bucket's flat buffer")
        gate = t.gates[step * k + k - 1] if len(t.gates) >= (step + 1) * k else None
        nxt = t.gates[(step + 1) * k] if len(t.gates) > (step + 1) * k else None
        ends = [x for x in (t.position(f"sync{step}:end"), nxt and t.position(nxt))
                if x is not None]
        out.append(Step(group, [], gate and t.position(gate),
                        min(ends) if ends else len(t.entries)))
    bad = _contents(r, rank, out, buckets)
    return out, bad


def _contents(r: CaseResult, rank: int, steps: list[Step], buckets) -> Verdict | None:
    """Match each all-reduce of each step to the bucket whose gradient it carried; a failed
    verdict for the first that carried none."""
    states = r.outputs[rank]["before"]
    grads = ex.local_gradients(r.case, states, rank)
    for step, (s, g) in enumerate(zip(steps, grads)):
        pieces = [[g[i] for i in b] for b in buckets]
        left = list(range(len(buckets)))
        for n, o in enumerate(s.all_reduces):
            got = kept_input(o)
            got = None if got is None else got.double()
            hit = next((b for b in left if _carries(got, pieces[b], r.world_size)), None)
            if hit is None:
                return _no_bucket(r, rank, step, n, o, got, pieces)
            left.remove(hit)
            s.bucket.append(hit)
    return None


def _no_bucket(r: CaseResult, rank: int, step: int, n: int, o: Op, got, pieces) -> Verdict:
    at = f"rank {rank}'s all-reduce {n + 1} of step {step} ({label(r)})"
    if got is None:
        return Verdict(False, f"{at}: the courier kept no readable copy of its bytes (the ranks "
                              "had sent more than it keeps per launch before it)")
    same_size = next((torch.cat(x) for x in pieces if sum(y.numel() for y in x) == got.numel()),
                     None)
    said = f": {describe(got, same_size)} of the bucket that size" if same_size is not None \
        else ""
    return Verdict(False, f"{at} carried {o.nbytes:,} bytes that are no bucket's gradient{said}. "
                          "Each all-reduce carries one bucket's gradients as this rank's "
                          "backward left them in .grad (summed over its micro-batches; zeros "
                          "for a parameter without gradient), or that divided by the world "
                          "size")


__all__ = ["Step", "bytes_hint", "counted", "label", "rank_steps"]
