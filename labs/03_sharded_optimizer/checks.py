"""Lab 03's visible checks (students have these) and the judges the hidden ones reuse; the
single-process reference is in expected.py, the traffic judges in traffic.py.

Judges run in the grader. Expected parameters come from training the same seeded model in one
process, in float64, on the whole batch (every rank had an equal slice, so the sharded run must
apply the *mean* gradient). Memory is read from what the ranks measured (bytes of the inner
optimizer's state tensors; gathered parameters alive after forward) and traffic from the
grader's courier: calls per operation (``reduce_scatter_tensor``, ``reduce_scatter_single`` and
the list form ``reduce_scatter`` are one operation, as are the all-gathers) and the elements
each took in: a reduce-scatter p·S (the flat padded vector), an all-gather S (a shard),
S = ⌈n/p⌉ for the case's model, and what the collectives carried (the courier keeps their
inputs): the rank's own flat gradient into each reduce-scatter (ZeRO's, and FSDP's per unit),
its shard of the parameters into each all-gather, from the grader's own float64 run. The pure
functions are judged on the case's (n, p), one row each. ZeRO §5.1-5.3 and §7.2 (Rajbhandari
et al., SC 2020): stage 2 keeps Kψ/N_d bytes of optimizer state per rank; stage 3 all-gathers
each unit twice and reduce-scatters its gradient once per step.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from _lab_harness import make_model  # the lab's harness.py
from autograder.lab import CaseResult, Check, LabInfo, Verdict, one_row_each
from autograder.outputs import FLOATS, Maybe, Seq, Tensor, state_form
from autograder.sandbox.rank import load_module

# This folder's expected.py and traffic.py, loaded by path as the grader loads every lab file.
EXPECTED, TRAFFIC = "_autograder_lab_03_expected", "_autograder_lab_03_traffic"
ex = load_module(Path(__file__).with_name("expected.py"), EXPECTED)
tr = load_module(Path(__file__).with_name("traffic.py"), TRAFFIC)
close, label, mismatch, reference, zero_contents = (ex.close, ex.label, ex.mismatch,
                                                    ex.reference, ex.zero_contents)
AG, RS, calls_text, counts, sizes = tr.AG, tr.RS, tr.calls_text, tr.counts, tr.sizes

LAB = LabInfo(
    slug="03_sharded_optimizer",
    title="Lab 03: a sharded optimizer and FSDP from scratch",
    student_files=("sharding.py",),
    names=("shard_bounds", "flatten_padded", "ShardedOptimizer", "FSDPLinear", "GatheredLinear"),
    forbidden_imports=("toolkit.data_parallel",),
    allowed_collectives=("all_gather_into_tensor", "reduce_scatter_tensor", "all_gather",
                         "reduce_scatter", "all_reduce", "broadcast"),
)

def _elements(case: dict) -> int:
    """Every parameter element of the case's model: a bound on any tensor a rank returns whose
    shape its code decides (a shard, a full weight); judges compare shapes before values."""
    return sum(q.numel() for q in make_model(case).parameters())


def _bounds_form(case: dict, inputs, rank: int, world_size: int) -> Seq:
    flat = Tensor(max_numel=4 * (max(int(n) for n in case["sizes"]) + 4))
    return Seq({"bounds": Seq(Seq(int)), "flat": flat}, len(_bounds_rows(case)))


def _zero_form(case: dict, inputs, rank: int, world_size: int) -> dict:
    return {"params": state_form(make_model(case).state_dict()), "state_elements": int}


def _fsdp_form(case: dict, inputs, rank: int, world_size: int) -> dict:
    units = len(_linears(make_model(case)))
    shard = Tensor(max_numel=_elements(case), dtypes=FLOATS)
    return {"init_shards": Seq(shard, units), "shards": Seq(shard, units),
            "held_after_forward": Maybe(int), "held_shard_view": Maybe(bool)}


def _fsdp_state_form(case: dict, inputs, rank: int, world_size: int) -> Seq:
    full = Tensor(max_numel=_elements(case), dtypes=FLOATS)
    return Seq({"weight": full, "bias": full}, len(_linears(make_model(case))))


# What each call's harness returns (`autograder.outputs`), checked before any judge reads it.
OUTPUTS = {"bounds": _bounds_form, "zero": _zero_form, "fsdp": _fsdp_form,
           "fsdp_state": _fsdp_state_form}

STATE_PER_ELEMENT = {"sgd": 1, "adam": 2}  # momentum; Adam's exp_avg + exp_avg_sq (any dtype)
SHARE_SLACK = 1.25  # "≈ 1/N_d": a rank may hold up to 25 % more than an even flat shard


def cases(call_cases, seed: int = 0, **extra) -> tuple[dict, ...]:
    """One case per (world_size, dims, frozen), each with its own seed."""
    return tuple({"world_size": p, "dims": list(dims), "frozen": list(frozen), "seed": seed + k,
                  **extra} for k, (p, dims, frozen) in enumerate(call_cases))


LOW_PRECISION = {"bfloat16", "float16"}
"""Collective dtypes (as the courier names them) that explain parameters off by rounding."""
KEEP_FLOAT32 = ("keep the gradients and the shards in float32 through every reduce-scatter and "
                "all-gather (the lab's spec; a 16-bit collective rounds them to 8-11 significant "
                "bits)")


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
    bad = mismatch(outputs, want)
    # The courier saw each collective's dtype: a 16-bit one fails whatever the values, since
    # on some seeds its rounding stays within the tolerance (1.7× above it at the closest of
    # 12,000 drawn seeds: not a margin a grade should rest on).
    low = sorted({o.dtype for t in r.traffic for o in t.ops if o.dtype in LOW_PRECISION})
    if bad is None:
        if low:
            return Verdict(False, f"a collective carried {', '.join(low)} ({label(r)}, {opt}, "
                                  f"{steps} steps): {KEEP_FLOAT32}; this run's rounding stayed "
                                  "within the tolerance, another's would not")
        return _sharded(tr.zero_collectives(r))
    rank, name = bad
    init = make_model(r.case).state_dict()
    got = outputs[rank].get(name) if isinstance(outputs[rank], dict) else None
    where = f"rank {rank}, parameter {name} ({label(r)}, {opt}, {steps} steps)"
    if name in r.case.get("frozen", ()):
        return Verdict(False, f"{where}: a frozen parameter (requires_grad=False) changed; "
                              "leave frozen parameters out of the flat shards")
    if opt == "sgd":
        summed = reference(r.case, steps=steps, optimizer=opt, grad_scale=r.world_size)
        if mismatch(outputs, {k: v.detach() for k, v in summed.state_dict().items()}) is None:
            return Verdict(False, f"the parameters match a run whose gradients were *summed* over "
                                  f"the {r.world_size} ranks ({label(r)}): divide the "
                                  "reduce-scattered gradient by the world size to average it")
    if isinstance(got, torch.Tensor) and close(got, init[name].double()):
        return Verdict(False, f"{where}: still the initial value: copy the all-gathered "
                              "parameters back into the model after the step")
    if low:  # a rounding, not (only) a wrong slice
        return Verdict(False, f"{where} differs from single-process training, and a collective "
                              f"carried {', '.join(low)}: {KEEP_FLOAT32}")
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
                                  f"({label(r)}): did the inner optimizer step?")
        if b >= full:
            return Verdict(False, f"rank {rank} holds {b:,} elements of {opt} state, the "
                                  f"whole model's {full:,}: it steps on the full tensor, not on "
                                  f"its 1/{r.world_size} shard ({even:,} elements) "
                                  f"({label(r)})")
        if b > SHARE_SLACK * even:
            return Verdict(False, f"rank {rank} holds {b:,} elements of {opt} state; an even "
                                  f"flat shard is {even:,} (1/{r.world_size} of {full:,}) "
                                  f"({label(r)})")
    return tr.zero_collectives(r)  # each rank received only its shard's gradient


def _sharded(verdict: Verdict) -> Verdict:
    """A values check's verdict once the values are right: whether the run was sharded, from
    what the courier moved and kept (traffic.py), whatever the values say."""
    if verdict.passed:
        return verdict
    return Verdict(False, f"the parameters are right, but the run was not sharded: "
                          f"{verdict.message}", verdict.kind)


def judge_zero_traffic(r: CaseResult) -> Verdict:
    """The values, then one flat reduce-scatter and one all-gather per step with the right
    contents: `judge_zero` itself, since its values count only for a sharded run."""
    return judge_zero(r)


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
            if not close(got, chunks[rank]):
                other = next((k for k, c in enumerate(chunks) if close(got, c)), None)
                said = f"chunk {other}'s elements" if other is not None else "other elements"
                return Verdict(False, f"before training, rank {rank}'s shard of layer {i} holds "
                                      f"{said}; it should hold [{rank}·S, {rank + 1}·S) of the "
                                      f"flat (weight, bias) vector, S = {size}: wrong shard "
                                      f"offsets ({label(r)})")
    for scale in (1.0, p):
        model = reference(r.case, steps=steps, optimizer="plain_sgd", grad_scale=scale)
        wrong = None
        for i, layer in enumerate(_linears(model)):
            want = _flat(layer).double()
            got = _assemble(r.outputs, "shards", i, want.numel())
            if got is None or not close(got, want):
                wrong = i
                break
        if wrong is None:
            if scale == 1.0:
                return _sharded(tr.fsdp_sharded(r, steps))
            return Verdict(False, f"the trained parameters match gradients *summed* over the {p} "
                                  f"ranks ({label(r)}): divide the reduce-scattered gradient by "
                                  "the world size")
        if scale == 1.0:
            first_wrong = wrong
    return Verdict(False, f"after {steps} SGD steps, layer {first_wrong}'s parameters (every "
                          f"rank's shard, put together) differ from single-process training "
                          f"({label(r)}): check the three gradients in backward and which "
                          f"shard reduce_scatter_grads returns")


def judge_fsdp_traffic(r: CaseResult) -> Verdict:
    """The values (sharded: `judge_fsdp`), nothing gathered held after forward, then two
    all-gathers and one reduce-scatter per unit and step, of S and p·S elements."""
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
        calls = counts(t)
        want = {AG: 2 * units * steps, RS: units * steps}
        got = {op: calls.get(op, 0) for op in want}
        if got != want:
            return Verdict(False, f"rank {rank} made {calls_text(got)} for {units} units × {steps} "
                                  f"steps; expected an all-gather in forward and one in backward "
                                  f"and a reduce-scatter per unit and step: {calls_text(want)}")
        ag, rs = sizes(t, AG), sizes(t, RS)
        if ag != want_ag or rs != want_rs:
            return Verdict(False, f"rank {rank}'s all-gathers took {ag} elements in and its "
                                  f"reduce-scatters {rs} ({label(r)}); the units' shards are "
                                  f"S = {shards}: each all-gather takes one unit's S-element "
                                  "shard, each reduce-scatter its flat padded gradient (p·S)")
    return Verdict(True)  # no all-reduce, broadcasts and contents: judge_fsdp's fsdp_sharded


def judge_fsdp_state(r: CaseResult) -> Verdict:
    model = reference(r.case, steps=1, optimizer="plain_sgd")
    for rank, out in enumerate(r.outputs):
        for i, layer in enumerate(_linears(model)):
            got = out[i] if isinstance(out, list) and len(out) > i else None
            for name in ("weight", "bias"):
                value = got.get(name) if isinstance(got, dict) else None
                if not close(value, getattr(layer, name).detach()):
                    return Verdict(False, f"rank {rank}: full_state_dict() of layer {i} gives a "
                                          f"{name} that differs from single-process training "
                                          f"after one step ({label(r)})")
    return _sharded(tr.fsdp_sharded(r, 1, final=True))  # full_state_dict gathers once more


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
