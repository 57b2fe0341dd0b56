"""Lab 03's visible checks (students have these) and the judges the hidden ones reuse.

Judges run in the grader. Expected parameters come from training the same seeded model in one
process, in float64, on the whole batch (every rank had an equal slice, so the sharded run must
apply the *mean* gradient). Memory is read from what the ranks measured (bytes of the inner
optimizer's state tensors; gathered parameters alive after forward) and traffic from the
grader's courier: calls per operation (``reduce_scatter_tensor``, ``reduce_scatter_single`` and
the list form ``reduce_scatter`` are one operation, as are the all-gathers) and the elements
each took in: a reduce-scatter p·S (the flat padded vector), an all-gather S (a shard),
S = ⌈n/p⌉ for the case's model, and what a ZeRO step's collectives carried (the courier keeps
their inputs): the rank's own flat gradient into the reduce-scatter, its shard of the updated
parameters into the all-gather, both from the grader's own float64 step. The pure functions
are judged on the case's (n, p), one row each. ZeRO §5.1-5.3 and §7.2 (Rajbhandari et al.,
SC 2020): stage 2 keeps Kψ/N_d bytes of optimizer state per rank; stage 3 all-gathers each unit
twice and reduce-scatters its gradient once per step.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from _lab_harness import (OPTIMIZERS, local_batch, make_data,  # the lab's harness.py
                          make_model, occurs)
from autograder.feedback import describe, kept_input
from autograder.lab import CaseResult, Check, LabInfo, Verdict, one_row_each

LAB = LabInfo(
    slug="03_sharded_optimizer",
    title="Lab 03: a sharded optimizer and FSDP from scratch",
    student_files=("sharding.py",),
    names=("shard_bounds", "flatten_padded", "ShardedOptimizer", "FSDPLinear", "GatheredLinear"),
    forbidden_imports=("toolkit.data_parallel",),
    allowed_collectives=("all_gather_into_tensor", "reduce_scatter_tensor", "all_gather",
                         "reduce_scatter", "all_reduce", "broadcast"),
)

# The operations the courier counts: torch 2.13 routes reduce_scatter_tensor and
# all_gather_into_tensor (deprecated) to the *_single ops, so either name counts as one call;
# the list forms (dist.all_gather / dist.reduce_scatter) move the same bytes to the same ranks,
# so they count as the same operation too.
RS, AG = "reduce_scatter_single", "all_gather_single"
SAME = {"reduce_scatter": RS, "all_gather": AG}
NAMES = {RS: "reduce_scatter_tensor / reduce_scatter_single (or reduce_scatter)",
         AG: "all_gather_into_tensor / all_gather_single (or all_gather)"}
STATE_PER_ELEMENT = {"sgd": 1, "adam": 2}  # momentum; Adam's exp_avg + exp_avg_sq (any dtype)
SHARE_SLACK = 1.25  # "≈ 1/N_d": a rank may hold up to 25 % more than an even flat shard


def cases(call_cases, seed: int = 0, **extra) -> tuple[dict, ...]:
    """One case per (world_size, dims, frozen), each with its own seed."""
    return tuple({"world_size": p, "dims": list(dims), "frozen": list(frozen), "seed": seed + k,
                  **extra} for k, (p, dims, frozen) in enumerate(call_cases))


def _label(r: CaseResult) -> str:
    frozen = f", frozen {', '.join(r.case['frozen'])}" if r.case.get("frozen") else ""
    return f"{r.world_size} ranks, layers {r.case['dims']}{frozen}"


def _training(case: dict, *, steps: int, optimizer: str, grad_scale: float = 1.0):
    """The seeded model trained in one process, float64, on the whole batch: yields the model
    before each step and once more after the last. `grad_scale` = world_size gives what a run
    that *sums* gradients over ranks would reach."""
    model = make_model(case).double()
    x, y = (t.double() for t in make_data(case))
    _, cls, options = OPTIMIZERS[optimizer]
    opt = cls([p for p in model.parameters() if p.requires_grad], **options)
    for _ in range(steps):
        yield model
        opt.zero_grad()
        (grad_scale * F.mse_loss(model(x), y)).backward()
        opt.step()
    yield model


def reference(case: dict, *, steps: int, optimizer: str, grad_scale: float = 1.0) -> nn.Module:
    """The model after `steps` steps of `_training`."""
    *_, model = _training(case, steps=steps, optimizer=optimizer, grad_scale=grad_scale)
    return model


def _padded(tensors: list[torch.Tensor], p: int) -> torch.Tensor:
    flat = torch.cat([t.detach().reshape(-1) for t in tensors])
    return torch.cat([flat, flat.new_zeros(p * math.ceil(flat.numel() / p) - flat.numel())])


def zero_contents(case: dict, p: int) -> list[tuple[list[list[torch.Tensor]], list[torch.Tensor]]]:
    """Per step of single-process training (float64), per trainable parameter in model order:
    each rank's local gradient (of the mean loss over its slice of the batch: what its
    reduce-scatter carries, flattened and padded) and the parameter after the step (what the
    all-gathers carry, shard by shard)."""
    steps, optimizer = case.get("steps", 3), case.get("optimizer", "sgd")
    out, grads = [], None
    for model in _training(case, steps=steps, optimizer=optimizer):
        params = [q for q in model.parameters() if q.requires_grad]
        if grads is not None:
            out.append((grads, [q.detach().reshape(-1).clone() for q in params]))
        grads = []
        for rank in range(p):
            x, y = (t.double() for t in local_batch(case, rank, p))
            grads.append([g.reshape(-1) for g in
                          torch.autograd.grad(F.mse_loss(model(x), y), params)])
    return out


def _in_blocks(values: torch.Tensor, blocks: list[torch.Tensor], same) -> list[int] | None:
    """`values` read as whole blocks back to back, each used once, in any order: the indices
    in the order found, until `values` or the blocks run out (what is left after them is not
    read); None when no unused block matches (`same(piece, block)`) where one must start."""
    order, at, left = [], 0, list(range(len(blocks)))
    while left and at < values.numel():
        k = next((k for k in left if same(values[at:at + blocks[k].numel()], blocks[k])), None)
        if k is None:
            return None
        order.append(k)
        left.remove(k)
        at += blocks[k].numel()
    return order


def _block_order(gathered: torch.Tensor | None, blocks: list[torch.Tensor]) -> list[int] | None:
    """The order in which a rank flattened the trainable parameters, read from what the ranks'
    first all-gathers carried put together (`gathered`, p·S, padding last): the parameter whose
    updated values come next, block by block. Model order is what `flatten_padded` of
    ``model.parameters()`` gives; any other order is as correct. None: no order explains it."""
    order = None if gathered is None else _in_blocks(gathered, blocks, _close)
    return order if order is not None and len(order) == len(blocks) else None


def _calls(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} × {NAMES.get(op, op)}" for op, n in counts.items())


LOW_PRECISION = {"bfloat16", "float16"}
"""Collective dtypes (as the courier names them) that explain parameters off by rounding."""


def _close(got, want: torch.Tensor) -> bool:
    return (isinstance(got, torch.Tensor) and got.shape == want.shape
            and torch.allclose(got.double(), want, rtol=1e-4, atol=2e-5))


def _mismatch(states: list, want: dict[str, torch.Tensor]) -> tuple[int, str] | None:
    """(rank, parameter name) of the first parameter that differs, or None."""
    for rank, state in enumerate(states):
        for name, value in want.items():
            if not isinstance(state, dict) or not _close(state.get(name), value):
                return rank, name
    return None


# -- shard_bounds and flatten_padded --------------------------------------------------------

def _bounds_hint(bounds, n: int, p: int) -> str:
    """Name the usual mistake: uneven chunks (torch.tensor_split's, empty ones included, or
    any other that covers exactly the n elements) instead of p equal padded shards."""
    sizes = [len(c) for c in torch.arange(n).tensor_split(p)]
    starts = [sum(sizes[:k]) for k in range(p)]
    split = [[a, a + k] for a, k in zip(starts, sizes)]
    equal = " here every rank holds the same S = ⌈n/p⌉ elements and the last shards end in padding."
    if bounds == split:
        return f" Those are torch.tensor_split's uneven chunks:{equal}"
    rows = [b for b in bounds if isinstance(b, list) and len(b) == 2]
    if len(rows) == p and rows[0][0] == 0 and rows[-1][1] == n and all(
            rows[k][1] == rows[k + 1][0] for k in range(p - 1)):
        return (" Those chunks cover exactly the n elements, unevenly (as torch.tensor_split "
                f"cuts them):{equal}")
    return " Rank r's shard starts at r·S, S = ⌈n/p⌉."


WORLD_SIZES = (1, 2, 3, 4)  # p for every n of a bounds case (`harness._bounds`)


def _bounds_rows(case: dict) -> list[tuple[int, int]]:
    """The (n, p) pairs the case asks for, in the order `harness._bounds` answers them: the
    grader's own list, so a rank cannot choose what is judged (nor how big)."""
    return [(int(n), p) for n in case["sizes"] for p in WORLD_SIZES]


def judge_bounds(r: CaseResult) -> Verdict:
    """One row per (n, p) of the case, in order; only each row's ``bounds`` and ``flat`` are
    read, and the expected flat vector is built from the case's n."""
    rows, want_rows = r.outputs[0], _bounds_rows(r.case)
    wrong = one_row_each(rows, len(want_rows), "(n, p) pair")
    if wrong is not None:
        return wrong
    for row, (n, p) in zip(rows, want_rows):
        size = math.ceil(n / p)
        want = [[k * size, (k + 1) * size] for k in range(p)]
        bounds = row.get("bounds")
        if bounds != want:
            hint = _bounds_hint(bounds, n, p) if isinstance(bounds, list) else ""
            return Verdict(False, f"shard_bounds({n}, {p}, r) for r = 0..{p - 1} gave "
                                  f"{str(bounds)[:200]}, expected {want}.{hint}")
        got = row.get("flat")
        if not (isinstance(got, torch.Tensor) and tuple(got.shape) == (p * size,)):
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            return Verdict(False, f"flatten_padded([arange({n})], {p}) gave {shape}, expected "
                                  f"{p}·⌈{n}/{p}⌉ = {p * size} elements: the values, then zeros")
        flat = torch.zeros(p * size)  # the case's n: small
        flat[:n] = torch.arange(n, dtype=torch.float32)
        if not torch.equal(got, flat):
            return Verdict(False, f"flatten_padded([arange({n})], {p}) has the right "
                                  f"{p * size} elements but not arange({n}) followed by zeros")
    return Verdict(True)


# -- ShardedOptimizer -----------------------------------------------------------------------

def judge_zero(r: CaseResult) -> Verdict:
    opt, steps = r.case.get("optimizer", "sgd"), r.case.get("steps", 3)
    outputs = [o.get("params") if isinstance(o, dict) else None for o in r.outputs]
    model = reference(r.case, steps=steps, optimizer=opt)
    want = {k: v.detach() for k, v in model.state_dict().items()}
    bad = _mismatch(outputs, want)
    if bad is None:
        return Verdict(True)
    rank, name = bad
    init = make_model(r.case).state_dict()
    got = outputs[rank].get(name) if isinstance(outputs[rank], dict) else None
    where = f"rank {rank}, parameter {name} ({_label(r)}, {opt}, {steps} steps)"
    if name in r.case.get("frozen", ()):
        return Verdict(False, f"{where}: a frozen parameter (requires_grad=False) changed; "
                              "leave frozen parameters out of the flat shards")
    if opt == "sgd":
        summed = reference(r.case, steps=steps, optimizer=opt, grad_scale=r.world_size)
        if _mismatch(outputs, {k: v.detach() for k, v in summed.state_dict().items()}) is None:
            return Verdict(False, f"the parameters match a run whose gradients were *summed* over "
                                  f"the {r.world_size} ranks ({_label(r)}): divide the "
                                  "reduce-scattered gradient by the world size to average it")
    if isinstance(got, torch.Tensor) and _close(got, init[name].double()):
        return Verdict(False, f"{where}: still the initial value: copy the all-gathered "
                              "parameters back into the model after the step")
    low = sorted({o.dtype for t in r.traffic for o in t.ops if o.dtype in LOW_PRECISION})
    if low:  # the courier saw the collective's dtype: a rounding, not (only) a wrong slice
        return Verdict(False, f"{where} differs from single-process training, and a collective "
                              f"carried {', '.join(low)}: keep the gradients and the shards in "
                              "float32 through every reduce-scatter and all-gather (the lab's "
                              "spec; a 16-bit collective rounds them to 8-11 significant bits)")
    return Verdict(False, f"{where} differs from single-process training: check the shard "
                          "offsets when slicing the flat vector and when copying it back")


def judge_state(r: CaseResult) -> Verdict:
    opt = r.case.get("optimizer", "adam")
    per = STATE_PER_ELEMENT[opt]
    model = make_model(r.case)
    n = sum(p.numel() for p in model.parameters() if p.requires_grad)
    full, even = per * n, per * math.ceil(n / r.world_size)
    got = [o.get("state_elements") if isinstance(o, dict) else None for o in r.outputs]
    for rank, b in enumerate(got):
        if not isinstance(b, int) or b < 0:
            return Verdict(False, f"rank {rank}: self.optimizer is not a torch optimizer; "
                                  "build it on your shard in __init__")
        if b == 0:
            return Verdict(False, f"rank {rank} holds no optimizer state after stepping "
                                  f"({_label(r)}): did the inner optimizer step?")
        if b >= full:
            return Verdict(False, f"rank {rank} holds {b:,} elements of {opt} state, the "
                                  f"whole model's {full:,}: it steps on the full tensor, not on "
                                  f"its 1/{r.world_size} shard ({even:,} elements) "
                                  f"({_label(r)})")
        if b > SHARE_SLACK * even:
            return Verdict(False, f"rank {rank} holds {b:,} elements of {opt} state; an even "
                                  f"flat shard is {even:,} (1/{r.world_size} of {full:,}) "
                                  f"({_label(r)})")
    return _zero_collectives(r)  # each rank received only its shard's gradient


def _elements(op) -> int:
    """Elements a rank passed into a collective (its inputs' bytes over the element size)."""
    dtype = getattr(torch, op.dtype, None)
    item = dtype.itemsize if isinstance(dtype, torch.dtype) else 1
    return op.nbytes // max(item, 1)


def _sizes(t, op: str) -> list[int]:
    """Elements each call of `op` (a list form counted as its single form) took in, sorted."""
    return sorted(_elements(o) for o in t.ops if SAME.get(o.op, o.op) == op)


def _counts(t) -> dict[str, int]:
    calls: dict[str, int] = {}
    for o in t.ops:
        calls[SAME.get(o.op, o.op)] = calls.get(SAME.get(o.op, o.op), 0) + 1
    return calls


def _late_broadcast(t) -> bool:
    """A broadcast after the rank's first reduce-scatter or all-gather: inside training, where
    it could move a gradient or parameters that the counted collectives should."""
    started = False
    for o in t.ops:
        started = started or SAME.get(o.op, o.op) in (RS, AG)
        if started and o.op == "broadcast" and o.nbytes:
            return True
    return False


def _is_parameters(got: torch.Tensor, blocks: list[torch.Tensor]) -> bool:
    """Whether `got` (a broadcast's input, +0.0 padding stripped) is initial parameter values:
    a run of them flattened in model order (all parameters, or the trainable ones), or whole
    parameters back to back in any order (a flat vector in another order)."""
    trainable = [b for b, q in blocks if q]
    if any(occurs(torch.cat(seq), got) for seq in ([b for b, _ in blocks], trainable) if seq):
        return True
    values = [b for b, _ in blocks]
    order = _in_blocks(got, values, torch.equal)
    return order is not None and sum(values[k].numel() for k in order) == got.numel()


def _foreign_broadcast(r: CaseResult) -> tuple[int, int, str] | None:
    """(rank, call, why) of a broadcast whose root sent anything but initial parameter values
    (`_is_parameters`; padding must be +0.0: a −0.0 carries a bit), or whose input the courier did
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
            got = _inputs(o)
            if got is None:
                return rank, k + 1, "the courier kept no readable copy of it"
            data = ((got != 0) | torch.signbit(got)).nonzero()
            got = got[:int(data.max()) + 1] if data.numel() else got[:0]  # +0.0 padding off
            calls, elements = calls + 1, elements + got.numel()
            if calls > len(params) or elements > total:
                return rank, k + 1, (f"the ranks broadcast more than one copy of the parameters "
                                     f"({calls} calls, {elements} elements; the model has "
                                     f"{len(params)} tensors, {total} elements)")
            if got.numel() and not _is_parameters(got, blocks):
                return rank, k + 1, "it sent something other than the initial parameters"
    return None


def _late_verdict(t, rank: int, what: str) -> Verdict | None:
    if _late_broadcast(t):
        return Verdict(False, f"rank {rank} called broadcast during training: {what} moves "
                              "data only by its reduce-scatter and all-gather (a broadcast is "
                              "allowed in __init__ only, to sync the initial parameters)")
    return None


def _foreign_verdict(r: CaseResult, what: str) -> Verdict:
    bad = _foreign_broadcast(r)
    if bad is not None:
        return Verdict(False, f"rank {bad[0]}'s broadcast {bad[1]}: {bad[2]}. {what} moves "
                              "data only by its reduce-scatter and all-gather; a broadcast may "
                              "only sync the initial weights, once")
    return Verdict(True)


def _zero_collectives(r: CaseResult) -> Verdict:
    """ZeRO-2's collectives per rank, from the courier's record: no all-reduce, no broadcast
    once training began, and per step one reduce-scatter of the flat padded gradient (p·S
    elements in, S out: the courier's result is 1/p of the input) and one all-gather of the
    S-element shard, S = ⌈P/p⌉ for the P trainable elements of the case's model."""
    steps, p = r.case.get("steps", 3), r.world_size
    n = sum(q.numel() for q in make_model(r.case).parameters() if q.requires_grad)
    size = math.ceil(n / p)
    want = {RS: steps, AG: steps}
    for rank, t in enumerate(r.traffic):
        calls = _counts(t)
        if calls.get("all_reduce"):
            return Verdict(False, f"rank {rank} called all_reduce {calls['all_reduce']} times: "
                                  "ZeRO-2 reduce-scatters the gradient (each rank needs only its "
                                  "shard's sum), then all-gathers the parameters")
        bad = _late_verdict(t, rank, "ZeRO-2's step")
        if bad is not None:
            return bad
        got = {op: calls.get(op, 0) for op in want}
        if got != want:
            return Verdict(False, f"rank {rank} made {_calls(got)} in {steps} steps; expected "
                                  f"one flat reduce-scatter and one all-gather per step, "
                                  f"{_calls(want)}")
        rs, ag = _sizes(t, RS), _sizes(t, AG)
        if rs != [p * size] * steps or ag != [size] * steps:
            return Verdict(False, f"rank {rank}'s reduce-scatters took {rs} elements in and its "
                                  f"all-gathers {ag} ({_label(r)}); the {n} trainable elements "
                                  f"make shards of S = ⌈{n}/{p}⌉ = {size}: each reduce-scatter "
                                  f"takes the flat padded gradient (p·S = {p * size}) and "
                                  f"returns S, each all-gather takes the S-element shard")
    foreign = _foreign_verdict(r, "ZeRO-2's step")
    return _zero_contents(r) if foreign.passed else foreign


def _inputs(op) -> torch.Tensor | None:
    """What a rank passed into a collective (`kept_input`), float64; None when not kept."""
    got = kept_input(op)
    return None if got is None else got.double()


def _zero_contents(r: CaseResult) -> Verdict:
    """What each step's collectives carried, from the courier's copies of their inputs: the
    reduce-scatter the rank's own flat padded gradient (or that over p: averaging first is
    fine), the all-gather the rank's shard of the *updated parameters*, the parameters in any
    one order (`_block_order`). Right calls and shapes can carry something else: all-gathering
    the summed gradient shards hands every rank the whole gradient, and a full optimizer hidden
    anywhere then trains replicated."""
    p = r.world_size
    per_step = zero_contents(r.case, p)
    rs = [[o for o in t.ops if SAME.get(o.op, o.op) == RS] for t in r.traffic]
    ag = [[o for o in t.ops if SAME.get(o.op, o.op) == AG] for t in r.traffic]
    firsts = [_inputs(a[0]) for a in ag]
    gathered = None if any(f is None for f in firsts) else torch.cat(firsts)
    order = _block_order(gathered, per_step[0][1]) or list(range(len(per_step[0][1])))
    for step, (grads, params) in enumerate(per_step, 1):
        flat = _padded([params[k] for k in order], p)
        size = flat.numel() // p
        for rank in range(p):
            got = _inputs(rs[rank][step - 1])
            want = _padded([grads[rank][k] for k in order], p)
            if not any(_close(got, want * c) for c in (1.0, 1.0 / p)):
                return Verdict(False, f"rank {rank}'s reduce-scatter in step {step} did not take "
                                      f"in its flat padded gradient (of the loss on its own slice "
                                      f"of the batch, {p}·S = {want.numel()} elements, or that "
                                      f"divided by {p}): {_said(got, want)} ({_label(r)})")
            got, want = _inputs(ag[rank][step - 1]), flat[rank * size:(rank + 1) * size]
            if not _close(got, want):
                return Verdict(False, f"rank {rank}'s all-gather in step {step} did not take in "
                                      f"its shard of the updated parameters (elements "
                                      f"[{rank}·S, {rank + 1}·S) of the flat trainable "
                                      f"parameters after the step, S = {size}): "
                                      f"{_said(got, want)}; ZeRO all-gathers parameters, so "
                                      f"each rank steps only its shard ({_label(r)})")
    return Verdict(True)


def _said(got: torch.Tensor | None, want: torch.Tensor) -> str:
    if got is None:
        return ("the courier kept no readable copy of it (the ranks had passed more than it "
                "keeps per launch before it)")
    return describe(got, want)


def judge_zero_traffic(r: CaseResult) -> Verdict:
    values = judge_zero(r)
    return _zero_collectives(r) if values.passed else values


# -- FSDPLinear ------------------------------------------------------------------------------

def _linears(model: nn.Module) -> list[nn.Linear]:
    return [m for m in model if isinstance(m, nn.Linear)]


def _flat(layer: nn.Linear) -> torch.Tensor:
    return torch.cat([layer.weight.detach().reshape(-1), layer.bias.detach().reshape(-1)])


def _assemble(outputs: list, key: str, unit: int, numel: int) -> torch.Tensor | None:
    try:
        return torch.cat([o[key][unit].double().reshape(-1) for o in outputs])[:numel]
    except (KeyError, IndexError, TypeError, RuntimeError):
        return None


def judge_fsdp(r: CaseResult) -> Verdict:
    p, steps = r.world_size, r.case.get("steps", 2)
    layers = _linears(make_model(r.case))
    for i, layer in enumerate(layers):  # the shards before training: offsets
        flat = _flat(layer).double()
        size = math.ceil(flat.numel() / p)
        padded = torch.cat([flat, flat.new_zeros(p * size - flat.numel())])
        chunks = [padded[k * size:(k + 1) * size] for k in range(p)]
        for rank, out in enumerate(r.outputs):
            got = out["init_shards"][i] if isinstance(out, dict) else None
            if not _close(got, chunks[rank]):
                other = next((k for k, c in enumerate(chunks) if _close(got, c)), None)
                said = f"chunk {other}'s elements" if other is not None else "other elements"
                return Verdict(False, f"before training, rank {rank}'s shard of layer {i} holds "
                                      f"{said}; it should hold [{rank}·S, {rank + 1}·S) of the "
                                      f"flat (weight, bias) vector, S = {size}: wrong shard "
                                      f"offsets ({_label(r)})")
    for scale in (1.0, p):
        model = reference(r.case, steps=steps, optimizer="plain_sgd", grad_scale=scale)
        wrong = None
        for i, layer in enumerate(_linears(model)):
            want = _flat(layer).double()
            got = _assemble(r.outputs, "shards", i, want.numel())
            if got is None or not _close(got, want):
                wrong = i
                break
        if wrong is None:
            if scale == 1.0:
                return Verdict(True)
            return Verdict(False, f"the trained parameters match gradients *summed* over the {p} "
                                  f"ranks ({_label(r)}): divide the reduce-scattered gradient by "
                                  "the world size")
        if scale == 1.0:
            first_wrong = wrong
    return Verdict(False, f"after {steps} SGD steps, layer {first_wrong}'s parameters (every "
                          f"rank's shard, put together) differ from single-process training "
                          f"({_label(r)}): check the three gradients in backward and which "
                          f"shard reduce_scatter_grads returns")


def judge_fsdp_traffic(r: CaseResult) -> Verdict:
    values = judge_fsdp(r)
    if not values.passed:
        return values
    steps, p = r.case.get("steps", 2), r.world_size
    layers = _linears(make_model(r.case))
    units = len(layers)
    shards = [math.ceil(_flat(m).numel() / p) for m in layers]  # S per unit
    want_ag = sorted(s for s in shards for _ in range(2 * steps))
    want_rs = sorted(p * s for s in shards for _ in range(steps))
    for rank, (out, t) in enumerate(zip(r.outputs, r.traffic)):
        held = out.get("held_after_forward") if isinstance(out, dict) else None
        if not isinstance(held, int):
            return Verdict(False, f"rank {rank}: the harness's measure of what is held after "
                                  "forward did not come back (was _lab_harness changed?)")
        if held and out.get("held_shard_view"):
            return Verdict(False, f"rank {rank} still held {held:,} bytes of full parameters "
                                  "after forward, among them the storage behind a unit's shard: "
                                  "a slice of the flat vector is a view that keeps all of it; "
                                  "clone your slice in __init__")
        if held:
            return Verdict(False, f"rank {rank} still held {held:,} bytes of gathered parameters "
                                  "after forward (a unit's full weight saved for backward or "
                                  "kept anywhere else, gathered parts kept on the unit, or a "
                                  "gather buffer zeroed instead of freed): release them right "
                                  "after use, save only x for backward, and gather the weight "
                                  "again in backward")
        calls = _counts(t)
        if calls.get("all_reduce"):
            return Verdict(False, f"rank {rank} called all_reduce: FSDP reduce-scatters the "
                                  "gradient, so each rank receives only its shard's sum "
                                  "((N−1)/N·Ψ per rank instead of 2(N−1)/N·Ψ)")
        bad = _late_verdict(t, rank, "FSDP")
        if bad is not None:
            return bad
        want = {AG: 2 * units * steps, RS: units * steps}
        got = {op: calls.get(op, 0) for op in want}
        if got != want:
            return Verdict(False, f"rank {rank} made {_calls(got)} for {units} units × {steps} "
                                  f"steps; expected an all-gather in forward and one in backward "
                                  f"and a reduce-scatter per unit and step: {_calls(want)}")
        ag, rs = _sizes(t, AG), _sizes(t, RS)
        if ag != want_ag or rs != want_rs:
            return Verdict(False, f"rank {rank}'s all-gathers took {ag} elements in and its "
                                  f"reduce-scatters {rs} ({_label(r)}); the units' shards are "
                                  f"S = {shards}: each all-gather takes one unit's S-element "
                                  "shard, each reduce-scatter its flat padded gradient (p·S)")
    return _foreign_verdict(r, "FSDP")


def judge_fsdp_state(r: CaseResult) -> Verdict:
    model = reference(r.case, steps=1, optimizer="plain_sgd")
    for rank, out in enumerate(r.outputs):
        for i, layer in enumerate(_linears(model)):
            got = out[i] if isinstance(out, list) and len(out) > i else None
            for name in ("weight", "bias"):
                value = got.get(name) if isinstance(got, dict) else None
                if not _close(value, getattr(layer, name).detach()):
                    return Verdict(False, f"rank {rank}: full_state_dict() of layer {i} gives a "
                                          f"{name} that differs from single-process training "
                                          f"after one step ({_label(r)})")
    return Verdict(True)


CHECKS = [
    Check("shard_bounds and flatten_padded: p equal shards of ⌈n/p⌉, zero padding", 6, "bounds",
          ({"world_size": 1, "sizes": [1, 7, 12, 13]},), judge_bounds,
          about="n = 1, 7, 12, 13 elements over p = 1-4 ranks (pure functions, one rank)."),
    Check("ShardedOptimizer (SGD + momentum): equals single-process training after 3 steps", 10,
          "zero", cases([(2, (7, 5, 3), ("0.bias",)), (3, (5, 4, 2), ())], optimizer="sgd"),
          judge_zero, about="Sizes p does not divide, a frozen bias; compared in float64."),
    Check("ShardedOptimizer (Adam): each rank holds ≈ 1/p of the optimizer state", 6, "zero",
          cases([(2, (7, 5, 3), ()), (4, (7, 5, 3), ())], seed=10, optimizer="adam"),
          judge_state, about="Bytes of exp_avg and exp_avg_sq measured on each rank; each "
                             "reduce-scatter's input p·S elements and what each reduce-scatter "
                             "and all-gather carried (courier)."),
    Check("FSDPLinear: shards in place, training equals single-process after 2 steps", 10,
          "fsdp", cases([(2, (5, 6, 3), ()), (2, (3, 4, 4, 2), ())], seed=20), judge_fsdp,
          about="Every rank's shard before training, then all shards put together after SGD."),
    Check("FSDPLinear: 2 all-gathers + 1 reduce-scatter per unit, nothing held after forward",
          8, "fsdp", cases([(2, (5, 6, 3), ())], seed=30, release=True), judge_fsdp_traffic,
          about="Calls from the courier; gathered bytes alive after the first forward (in any "
                "tensor, storage or numpy array the garbage collector reaches)."),
]
