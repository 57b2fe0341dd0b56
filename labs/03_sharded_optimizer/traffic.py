"""Lab 03's traffic judges: what the grader's courier saw each rank's collectives carry.

Calls per operation (``reduce_scatter_tensor``, ``reduce_scatter_single`` and the list form
``reduce_scatter`` are one operation, as are the all-gathers), the elements each took in (a
reduce-scatter p·S, the flat padded vector; an all-gather S, a shard; S = ⌈n/p⌉ for the case's
model) and their contents: the courier keeps their inputs, compared with the grader's own
float64 run (expected.py): ZeRO's step by step, FSDP's unit by unit in any order, so that no
check rests on what moved outside the courier. A broadcast may only sync the initial weights,
once.
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


def fsdp_sharded(r: CaseResult, steps: int, *, final: bool = False) -> Verdict:
    """FSDP's sharding, from what the courier moved and kept, not from the values (a plain DDP
    whose "all-gathers" were all-reduces of a zero buffer holding each rank's shard scored on
    values alone: 74/100): no all-reduce carrying data (it hands every rank the whole sum), no
    broadcast once training began or of anything but the initial weights; every reduce-scatter
    takes a unit's flat padded gradient (p·S elements, so it returns S) and every all-gather
    one S-element shard, S = ⌈n/p⌉ for the case's units. Then what each carried (the courier's
    copies, `fsdp_contents`) against the grader's float64 run of `steps` SGD steps (`final`:
    the run gathers the parameters once more after them, as `full_state_dict` does)."""
    p = r.world_size
    runs = [unit_flats(m) for m in ex.training(r.case, steps=steps, optimizer="plain_sgd")]
    shards = [math.ceil(f.numel() / p) for f in runs[0]]
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
    foreign = foreign_verdict(r, "FSDP")
    return fsdp_contents(r, runs, steps + final) if foreign.passed else foreign


def fsdp_contents(r: CaseResult, runs: list[list[torch.Tensor]], points: int) -> Verdict:
    """What each FSDP collective carried, from the courier's copies of their inputs, against
    the grader's float64 run (`runs`: each unit's flat parameters before each step and after
    the last): every all-gather the rank's shard of one unit's parameters at some point of it,
    every reduce-scatter the rank's own flat padded local gradient of one unit at some step
    (`is_gradient` of ZeRO's `zero_contents`: of the loss on the rank's slice of the batch, or
    that over p). Each shard of the first `points` points (forward gathers every unit at every
    step) and each unit's gradient of every step must pass at least once, in any order: a run
    whose collectives carry decoys (zeros of the right size) while the data moves by a channel
    outside the courier fails, and replaying a right value where another was due buys nothing,
    since the due one must pass the courier too."""
    p, units = r.world_size, len(runs[0])
    case = dict(r.case, steps=len(runs) - 1, optimizer="plain_sgd")
    grads = [[[padded(g[i:i + 2], p) for i in range(0, len(g), 2)] for g in per_rank]
             for per_rank, _ in ex.zero_contents(case, p)]  # [step][rank][unit]: (weight, bias)
    # (an FSDP case freezes nothing: its parameters are every unit's weight then bias)
    for rank in range(p):
        shards = [padded([f], p).chunk(p)[rank] for flats in runs for f in flats]
        due = points * units
        bad = (carried(r, rank, AG, shards[:due], shards[due:], close,
                       "its shard of a unit's parameters (elements [r·S, (r+1)·S) of the flat "
                       "(weight, bias) vector, as a step left them)",
                       "unit {u} after {n} SGD step(s)", "FSDP gathers parameters, never gradients")
               or carried(r, rank, RS, [u for step in grads for u in step[rank]], [],
                          lambda g, w: is_gradient(g, w, p),
                          "its flat padded gradient of a unit (of the loss on its own slice of "
                          f"the batch, or that over {p})", "unit {u} in step {s}",
                          "FSDP reduce-scatters each unit's gradient once a step"))
        if bad is not None:
            return bad
    return Verdict(True)


def carried(r: CaseResult, rank: int, op: str, due: list[torch.Tensor],
            also: list[torch.Tensor], same, what: str, at: str, rule: str) -> Verdict | None:
    """A failing verdict when one of `rank`'s calls of `op` took in none of `due` + `also`
    (`same(got, want)`), or when a value of `due` (units × steps, `at` naming one) passed in
    none; None when every call carried an expected value and every due one passed."""
    calls = [o for o in r.traffic[rank].ops if SAME.get(o.op, o.op) == op]
    got, units = [inputs(o) for o in calls], len(r.case["dims"]) - 1
    name = "all-gather" if op == AG else "reduce-scatter"
    for k, g in enumerate(got):
        if not any(same(g, w) for w in due + also):
            why = (said(g, due[0]) if g is None else "it carried only zeros"
                   if not bool(g.any()) else f"it carried other values ({calls[k].dtype})")
            return Verdict(False, f"rank {rank}'s {name} {k + 1} did not take in {what}: {why} "
                                  f"({label(r)}); {rule}")
    j = next((j for j, w in enumerate(due) if not any(same(g, w) for g in got)), None)
    if j is None:
        return None
    where = at.format(u=j % units, n=j // units, s=j // units + 1)
    return Verdict(False, f"no {name} of rank {rank} took in {what} for {where} ({label(r)}): "
                          f"the data must move by the collectives; {rule}")


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
            if not is_gradient(got, want, p):
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


def is_gradient(got: torch.Tensor | None, want: torch.Tensor, p: int) -> bool:
    """Whether a reduce-scatter's input is the rank's local gradient `want`, or that over p
    (averaging before the reduce-scatter is as right as after it)."""
    return any(close(got, want * c) for c in (1.0, 1.0 / p))


def said(got: torch.Tensor | None, want: torch.Tensor) -> str:
    if got is None:
        return ("the courier kept no readable copy of it (the ranks had passed more than it "
                "keeps per launch before it)")
    return describe(got, want)
