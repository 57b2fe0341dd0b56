"""Lab 03's traffic judges: what the grader's courier saw each rank's collectives carry.

Calls per operation (``reduce_scatter_tensor``, ``reduce_scatter_single`` and the list form
``reduce_scatter`` are one operation, as are the all-gathers), the elements each took in (a
reduce-scatter p·S, the flat padded vector; an all-gather S, a shard; S = ⌈n/p⌉ for the case's
model) and, for ZeRO, their contents: the courier keeps their inputs, compared with the
grader's own float64 step (expected.py). A broadcast may only sync the initial weights, once.
ZeRO §5.1-5.3 and §7.2 (Rajbhandari et al., SC 2020). The values checks rest on these too: a
sharded optimizer or an FSDP unit whose collectives do not shard is not one, whatever its
values (`zero_collectives`, `fsdp_sharded`).
"""

from __future__ import annotations

import math
import sys

import torch

from _lab_harness import make_model, occurs  # the lab's harness.py
from autograder.feedback import describe, kept_input
from autograder.lab import CaseResult, Verdict

ex = sys.modules["_autograder_lab_03_expected"]  # expected.py: checks.py loads it just before
block_order, close, in_blocks, label, padded = (ex.block_order, ex.close, ex.in_blocks, ex.label,
                                                ex.padded)

# The operations the courier counts: torch 2.13 routes reduce_scatter_tensor and
# all_gather_into_tensor (deprecated) to the *_single ops, so either name counts as one call;
# the list forms (dist.all_gather / dist.reduce_scatter) move the same bytes to the same ranks,
# so they count as the same operation too.
RS, AG = "reduce_scatter_single", "all_gather_single"
SAME = {"reduce_scatter": RS, "all_gather": AG}
NAMES = {RS: "reduce_scatter_tensor / reduce_scatter_single (or reduce_scatter)",
         AG: "all_gather_into_tensor / all_gather_single (or all_gather)"}


def calls_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} × {NAMES.get(op, op)}" for op, n in counts.items())


def elements(op) -> int:
    """Elements a rank passed into a collective (its inputs' bytes over the element size)."""
    dtype = getattr(torch, op.dtype, None)
    item = dtype.itemsize if isinstance(dtype, torch.dtype) else 1
    return op.nbytes // max(item, 1)


def sizes(t, op: str) -> list[int]:
    """Elements each call of `op` (a list form counted as its single form) took in, sorted."""
    return sorted(elements(o) for o in t.ops if SAME.get(o.op, o.op) == op)


def counts(t) -> dict[str, int]:
    calls: dict[str, int] = {}
    for o in t.ops:
        calls[SAME.get(o.op, o.op)] = calls.get(SAME.get(o.op, o.op), 0) + 1
    return calls


def late_broadcast(t) -> bool:
    """A broadcast after the rank's first reduce-scatter or all-gather: inside training, where
    it could move a gradient or parameters that the counted collectives should."""
    started = False
    for o in t.ops:
        started = started or SAME.get(o.op, o.op) in (RS, AG)
        if started and o.op == "broadcast" and o.nbytes:
            return True
    return False


def is_parameters(got: torch.Tensor, blocks: list[torch.Tensor]) -> bool:
    """Whether `got` (a broadcast's input, +0.0 padding stripped) is initial parameter values:
    a run of them flattened in model order (all parameters, or the trainable ones), or whole
    parameters back to back in any order (a flat vector in another order)."""
    trainable = [b for b, q in blocks if q]
    if any(occurs(torch.cat(seq), got) for seq in ([b for b, _ in blocks], trainable) if seq):
        return True
    values = [b for b, _ in blocks]
    order = in_blocks(got, values, torch.equal)
    return order is not None and sum(values[k].numel() for k in order) == got.numel()


def foreign_broadcast(r: CaseResult) -> tuple[int, int, str] | None:
    """(rank, call, why) of a broadcast whose root sent anything but initial parameter values
    (`is_parameters`; padding must be +0.0: a −0.0 carries a bit), or whose input the courier did
    not keep, or of the broadcast past one copy of the parameters: the case's roots together may
    send at most as many calls as the model has parameter tensors and as many elements as it has
    parameters (so the choice of runs cannot carry data either). None when every broadcast is a
    constructor's habit of syncing the weights. Any other data (the batch, so that every rank
    could train on all of it) fails, whenever it was sent."""
    params = list(make_model(r.case).parameters())
    blocks = [(q.detach().reshape(-1).double(), q.requires_grad) for q in params]
    calls, elements, total = 0, 0, sum(q.numel() for q in params)
    for rank, t in enumerate(r.traffic):
        for k, o in enumerate(x for x in t.ops if x.op == "broadcast"):
            if o.peer != rank or not o.nbytes:
                continue  # a receiving rank's input is only its buffer
            got = inputs(o)
            if got is None:
                return rank, k + 1, "the courier kept no readable copy of it"
            data = ((got != 0) | torch.signbit(got)).nonzero()
            got = got[:int(data.max()) + 1] if data.numel() else got[:0]  # +0.0 padding off
            calls, elements = calls + 1, elements + got.numel()
            if calls > len(params) or elements > total:
                return rank, k + 1, (f"the ranks broadcast more than one copy of the parameters "
                                     f"({calls} calls, {elements} elements; the model has "
                                     f"{len(params)} tensors, {total} elements)")
            if got.numel() and not is_parameters(got, blocks):
                return rank, k + 1, "it sent something other than the initial parameters"
    return None


def late_verdict(t, rank: int, what: str) -> Verdict | None:
    if late_broadcast(t):
        return Verdict(False, f"rank {rank} called broadcast during training: {what} moves "
                              "data only by its reduce-scatter and all-gather (a broadcast is "
                              "allowed in __init__ only, to sync the initial parameters)")
    return None


def foreign_verdict(r: CaseResult, what: str) -> Verdict:
    bad = foreign_broadcast(r)
    if bad is not None:
        return Verdict(False, f"rank {bad[0]}'s broadcast {bad[1]}: {bad[2]}. {what} moves "
                              "data only by its reduce-scatter and all-gather; a broadcast may "
                              "only sync the initial weights, once")
    return Verdict(True)


def zero_collectives(r: CaseResult) -> Verdict:
    """ZeRO-2's collectives per rank, from the courier's record: no all-reduce, no broadcast
    once training began, and per step one reduce-scatter of the flat padded gradient (p·S
    elements in, S out: the courier's result is 1/p of the input) and one all-gather of the
    S-element shard, S = ⌈P/p⌉ for the P trainable elements of the case's model."""
    steps, p = r.case.get("steps", 3), r.world_size
    n = sum(q.numel() for q in make_model(r.case).parameters() if q.requires_grad)
    size = math.ceil(n / p)
    want = {RS: steps, AG: steps}
    for rank, t in enumerate(r.traffic):
        calls = counts(t)
        if calls.get("all_reduce"):
            return Verdict(False, f"rank {rank} called all_reduce {calls['all_reduce']} times: "
                                  "ZeRO-2 reduce-scatters the gradient (each rank needs only its "
                                  "shard's sum), then all-gathers the parameters")
        bad = late_verdict(t, rank, "ZeRO-2's step")
        if bad is not None:
            return bad
        got = {op: calls.get(op, 0) for op in want}
        if got != want:
            return Verdict(False, f"rank {rank} made {calls_text(got)} in {steps} steps; expected "
                                  f"one flat reduce-scatter and one all-gather per step, "
                                  f"{calls_text(want)}")
        rs, ag = sizes(t, RS), sizes(t, AG)
        if rs != [p * size] * steps or ag != [size] * steps:
            return Verdict(False, f"rank {rank}'s reduce-scatters took {rs} elements in and its "
                                  f"all-gathers {ag} ({label(r)}); the {n} trainable elements "
                                  f"make shards of S = ⌈{n}/{p}⌉ = {size}: each reduce-scatter "
                                  f"takes the flat padded gradient (p·S = {p * size}) and "
                                  f"returns S, each all-gather takes the S-element shard")
    foreign = foreign_verdict(r, "ZeRO-2's step")
    return zero_contents_verdict(r) if foreign.passed else foreign


def unit_flats(model: torch.nn.Module) -> list[torch.Tensor]:
    """Each FSDP unit's flat (weight, bias) vector, float64: one per Linear of the model."""
    return [torch.cat([m.weight.detach().reshape(-1), m.bias.detach().reshape(-1)]).double()
            for m in model if isinstance(m, torch.nn.Linear)]


def fsdp_sharded(r: CaseResult, steps: int) -> Verdict:
    """FSDP's sharding, from what the courier moved and kept, not from the values (a plain DDP
    whose "all-gathers" were all-reduces of a zero buffer holding each rank's shard scored on
    values alone: 74/100): no all-reduce carrying data (it hands every rank the whole sum), no
    broadcast once training began or of anything but the initial weights; every reduce-scatter
    takes a unit's flat padded gradient (p·S elements, so it returns S) and every all-gather
    one S-element shard, S = ⌈n/p⌉ for the case's units; and what each all-gather carried (the
    courier's copy) is the rank's own shard of one unit's parameters at some step of the
    grader's float64 run (`steps` SGD steps, every point counted: a gathered gradient is not
    a shard of parameters)."""
    p = r.world_size
    runs = [unit_flats(m) for m in ex.training(r.case, steps=steps, optimizer="plain_sgd")]
    shards = [math.ceil(f.numel() / p) for f in runs[0]]
    mine = [[padded([f], p)[rank * s:(rank + 1) * s] for fl in runs for f, s in zip(fl, shards)]
            for rank in range(p)]
    for rank, t in enumerate(r.traffic):
        if any(o.op == "all_reduce" and o.nbytes for o in t.ops):
            return Verdict(False, f"rank {rank} called all_reduce: FSDP reduce-scatters the "
                                  "gradient, so each rank receives only its shard's sum "
                                  "((N−1)/N·Ψ per rank instead of 2(N−1)/N·Ψ), and all-gathers "
                                  "the parameters")
        bad = late_verdict(t, rank, "FSDP")
        if bad is not None:
            return bad
        ag, rs = sizes(t, AG), sizes(t, RS)
        if any(n not in shards for n in ag) or any(n not in [p * s for s in shards] for n in rs):
            return Verdict(False, f"rank {rank}'s all-gathers took {ag} elements in and its "
                                  f"reduce-scatters {rs} ({label(r)}); the units' shards are "
                                  f"S = {shards}: each all-gather takes one unit's S-element "
                                  "shard, each reduce-scatter its flat padded gradient (p·S)")
        for k, o in enumerate(x for x in t.ops if SAME.get(x.op, x.op) == AG):
            got = inputs(o)
            if not any(close(got, want) for want in mine[rank]):
                what = said(got, mine[rank][0]) if got is None else "it carried other values"
                return Verdict(False, f"rank {rank}'s all-gather {k + 1} did not take in its "
                                      "shard of a unit's parameters (elements [r·S, (r+1)·S) of "
                                      "the flat (weight, bias) vector, as the step left them): "
                                      f"{what} ({label(r)}); FSDP gathers parameters, never "
                                      "gradients")
    return foreign_verdict(r, "FSDP")


def inputs(op) -> torch.Tensor | None:
    """What a rank passed into a collective (`kept_input`), float64; None when not kept."""
    got = kept_input(op)
    return None if got is None else got.double()


def zero_contents_verdict(r: CaseResult) -> Verdict:
    """What each step's collectives carried, from the courier's copies of their inputs: the
    reduce-scatter the rank's own flat padded gradient (or that over p: averaging first is
    fine), the all-gather the rank's shard of the *updated parameters*, the parameters in any
    one order (`block_order`). Right calls and shapes can carry something else: all-gathering
    the summed gradient shards hands every rank the whole gradient, and a full optimizer hidden
    anywhere then trains replicated."""
    p = r.world_size
    per_step = ex.zero_contents(r.case, p)
    rs = [[o for o in t.ops if SAME.get(o.op, o.op) == RS] for t in r.traffic]
    ag = [[o for o in t.ops if SAME.get(o.op, o.op) == AG] for t in r.traffic]
    firsts = [inputs(a[0]) for a in ag]
    gathered = None if any(f is None for f in firsts) else torch.cat(firsts)
    order = block_order(gathered, per_step[0][1]) or list(range(len(per_step[0][1])))
    for step, (grads, params) in enumerate(per_step, 1):
        flat = padded([params[k] for k in order], p)
        size = flat.numel() // p
        for rank in range(p):
            got = inputs(rs[rank][step - 1])
            want = padded([grads[rank][k] for k in order], p)
            if not any(close(got, want * c) for c in (1.0, 1.0 / p)):
                return Verdict(False, f"rank {rank}'s reduce-scatter in step {step} did not take "
                                      f"in its flat padded gradient (of the loss on its own slice "
                                      f"of the batch, {p}·S = {want.numel()} elements, or that "
                                      f"divided by {p}): {said(got, want)} ({label(r)})")
            got, want = inputs(ag[rank][step - 1]), flat[rank * size:(rank + 1) * size]
            if not close(got, want):
                return Verdict(False, f"rank {rank}'s all-gather in step {step} did not take in "
                                      f"its shard of the updated parameters (elements "
                                      f"[{rank}·S, {rank + 1}·S) of the flat trainable "
                                      f"parameters after the step, S = {size}): "
                                      f"{said(got, want)}; ZeRO all-gathers parameters, so "
                                      f"each rank steps only its shard ({label(r)})")
    return Verdict(True)


def said(got: torch.Tensor | None, want: torch.Tensor) -> str:
    if got is None:
        return ("the courier kept no readable copy of it (the ranks had passed more than it "
                "keeps per launch before it)")
    return describe(got, want)
