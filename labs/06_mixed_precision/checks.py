"""Lab 06's visible checks and the judges the hidden ones reuse.

Masters: fp32 copies (not the working tensors), rounded back into the bf16 working weights in
place. Scaler: the dynamic rule against `toolkit.precision.next_scale`, step by step, and a
scaler restored from its state dict continuing identically. Unscale: fp32 master gradients
equal to grad / s, and the inf/NaN of one rank found on every rank (one all-reduce of at most
FLAG_BYTES, counted by the grader's courier; in training the flag may also ride in the
gradient all-reduce, as with torch's DDP and GradScaler: README.md says which forms). Reduce:
the mean over the ranks from one all-reduce of 2 bytes per element (bf16, half of fp32's),
bytes recorded by the courier. Train: the masters after every step against float64 SGD within
`expected.TOLERANCE`, the skipped steps exactly where an overflow was injected on one rank, the
scale after each step, and the working weights equal to the masters rounded to bf16 on every
rank (Micikevicius et al., 2018, §3.1-3.2).

Every count, byte and dtype is judged over the whole case (`r.traffic[rank]`, bounded by the
courier, which hands out the case and takes its output), never inside the harness's sections:
their marks are sent by the rank, and a forged pair once moved a float32 all-reduce out of the
counted section (red team 3). Sections only say which step a message is about. What every
all-reduce carried is judged too (traffic.py: the rank's own gradients, its own inf/NaN
answer), in the values checks as well: all-reduces of zeros with the data moved through
futexes on a shared library scored 100 (red team 8). Every result
is checked against its declared form (`OUTPUTS`) before a judge reads it: the judges subtract
masters and gradients from the reference, so their shapes are exact (issue 30).
"""

from __future__ import annotations

from pathlib import Path

import torch

from autograder.feedback import describe
from autograder.lab import CaseResult, Check, LabInfo, Verdict
from autograder.outputs import SCALAR, Mapping, Maybe, Seq, Tensor
from autograder.sandbox.rank import load_module


# This folder's expected.py and traffic.py, loaded by path as the grader loads every lab file.
ex = load_module(Path(__file__).with_name("expected.py"), "_autograder_lab_06_expected")
tr = load_module(Path(__file__).with_name("traffic.py"), "_autograder_lab_06_traffic")
FLAG_BYTES = tr.FLAG_BYTES

LAB = LabInfo(
    slug="06_mixed_precision",
    title="Lab 06: a mixed-precision training step",
    student_files=("mixed_precision.py",),
    names=("master_copy", "copy_to_working", "LossScaler", "all_reduce_gradients",
           "train_step"),
    forbidden_imports=("toolkit.precision",),
    allowed_collectives=("all_reduce",),
)
NOT_KEPT = "master weights not kept"
ANY = None  # any dtype: the judges name a wrong one (a master that is not float32, ...)
BF16 = frozenset({"bfloat16"})


def _shapes(tensors) -> list[tuple[int, ...]]:
    return [tuple(t.shape) for t in tensors]


def _masters_form(case: dict, inputs: dict, rank: int, world_size: int) -> dict:
    shapes, most = _shapes(inputs["w"]), sum(t.numel() for t in inputs["w"])
    # master_copy decides how many tensors and their shapes (judge_masters names a wrong
    # count, and compares with torch.equal, which never broadcasts); copy_to_working then
    # writes the harness's own bf16 parameters
    return {"masters": Seq(Maybe(Tensor(max_numel=most))), "leaf": Seq(bool),
            "shared": Seq(bool), "working": Maybe([Tensor(s, BF16) for s in shapes]),
            "same_storage": Maybe(Seq(bool, len(shapes)))}


def _scaler_form(case: dict, inputs, rank: int, world_size: int) -> dict:
    flags, split = case["flags"], case["split"]
    return {"scaled": Maybe(Tensor(max_numel=1)), "scales": Seq(float, len(flags)),
            "resumed": Seq(float, len(flags) - split), "state": Maybe(Mapping(SCALAR))}


def _grads_form(case: dict, inputs: dict, rank: int, world_size: int) -> dict:
    grads = [Maybe(Tensor(s, ANY)) for s in _shapes(inputs["g"])]  # judged after arithmetic
    return {"found": bool, "grads": grads, "working": grads} if case["kind"] == "unscale" \
        else {"grads": grads}


def _train_form(case: dict, inputs: dict, rank: int, world_size: int) -> dict:
    shapes = [(case["d_out"], case["d_in"]), (case["d_out"],)]
    return {"history": Seq({"stepped": Maybe(bool), "scale": float,
                            "masters": [Maybe(Tensor(s, ANY)) for s in shapes],
                            "working": [Tensor(s, BF16) for s in shapes]}, case["steps"])}


# What each call's harness returns (`autograder.outputs`), checked before any judge reads it:
# lab 06's judges subtract and compare masters and gradients, so their shapes are exact (a
# (2²¹, 1, 1) "gradient" broadcast against the reference took 5.4 GB of the grader).
OUTPUTS = {"masters": _masters_form, "scaler": _scaler_form, "unscale": _grads_form,
           "reduce": _grads_form, "train": _train_form}


def case(kind: str, world_size: int, seed: int, **params) -> dict:
    return {"world_size": world_size, "kind": kind, "seed": seed, **params}


def _fail(r: CaseResult, text: str) -> Verdict:
    return Verdict(False, f"{text} ({r.world_size} ranks)")


def judge_masters(r: CaseResult) -> Verdict:
    want = [w.float() for w in ex.rounded(r.inputs[0]["w"])]
    new = ex.rounded(r.inputs[0]["new"])
    for rank, o in enumerate(r.outputs):
        masters = o.get("masters", [])
        if len(masters) != len(want):
            return _fail(r, f"rank {rank}: master_copy returned {len(masters)} tensors for "
                            f"{len(want)} parameters")
        for k, (m, w) in enumerate(zip(masters, want)):
            if o["shared"][k]:
                return _fail(r, f"master {k} shares memory with its working parameter ({NOT_KEPT}):"
                                f" it must be a separate fp32 copy, or the update is made in "
                                f"16 bits")
            if isinstance(m, torch.Tensor) and m.dtype != torch.float32:
                return _fail(r, f"master {k} is {str(m.dtype)[6:]}, not float32 ({NOT_KEPT}): "
                                f"an update lr·g below half the 16-bit spacing of a weight "
                                f"rounds away, so the weights stop moving")
            if not (isinstance(m, torch.Tensor) and torch.equal(m, w)):
                return _fail(r, f"master {k} on rank {rank}: {describe(m, w)} (the working "
                                f"weight's value, exactly, in float32)")
            if not o["leaf"][k]:
                return _fail(r, f"master {k} is not a leaf tensor that requires grad: the "
                                f"optimizer cannot step it (make it an nn.Parameter)")
        for k, (p, w) in enumerate(zip(o.get("working", []), new)):
            if not torch.equal(p, w):
                return _fail(r, f"copy_to_working, parameter {k} on rank {rank}: "
                                f"{describe(p, w)} (the master rounded to bfloat16)")
            if not o["same_storage"][k]:
                return _fail(r, f"copy_to_working replaced parameter {k} instead of writing "
                                f"into it: the model and the optimizer would no longer share it")
        if "working" not in o:
            return _fail(r, f"rank {rank}: master_copy's tensors do not have the parameters' "
                            f"shapes")
    return Verdict(True)


def judge_scaler(r: CaseResult) -> Verdict:
    c = r.case
    flags, split = c["flags"], c["split"]
    want = ex.scales(c, flags)
    o = r.outputs[0]
    scaled = o.get("scaled")
    if not (isinstance(scaled, torch.Tensor) and float(scaled) == 3.0 * c["init_scale"]):
        return _fail(r, f"scale_loss(3.0) returned {scaled}, expected 3·s = "
                        f"{3.0 * c['init_scale']:g}")
    rule = (f"growth ×{c.get('growth_factor', 2.0):g} after {c['growth_interval']} good steps, "
            f"backoff ×{c.get('backoff_factor', 0.5):g}")
    for k, (got, w) in enumerate(zip(o["scales"], want)):
        if got != w:
            why, before = "", want[k - 1] if k else c["init_scale"]
            if not flags[k] and got == before * c.get("growth_factor", 2.0):
                why = ": it grew too early (N good steps in a row, then grow and restart the count)"
            elif flags[k] and got == before:
                why = ": an inf/NaN step must back off"
            return _fail(r, f"after update {k + 1} (flags {flags[:k + 1]}, {rule}) the scale is "
                            f"{got:g}, expected {w:g}{why}")
    state = o.get("state") or {}
    missing = {"scale", "good_steps", "growth_factor", "backoff_factor",
               "growth_interval"} - set(state)
    if missing:
        return _fail(r, f"state_dict() lacks {sorted(missing)}")
    if o["resumed"] != want[split:]:
        return _fail(r, f"a LossScaler restored with load_state_dict(state_dict()) after "
                        f"{split} updates continues with scales {o['resumed']}, the original "
                        f"with {want[split:]}: the state dict must hold the scale, the good "
                        f"steps in a row and the rule")
    return Verdict(True)


def judge_unscale(r: CaseResult) -> Verdict:
    c, scale = r.case, r.case["scale"]
    bad = c.get("bad")
    found = [o.get("found") for o in r.outputs]
    for rank, o in enumerate(r.outputs):
        for k, g in enumerate(r.inputs[rank]["g"]):
            got = o["grads"][k]
            if k == c.get("none"):
                if got is not None:
                    return _fail(r, f"parameter {k} has no gradient, but its master got one")
                continue
            want = (g.to(torch.bfloat16).double() / scale).float()
            if bad is not None and bad[0] == rank and k == len(r.inputs[rank]["g"]) - 1:
                want.view(-1)[0] = float(bad[1])
            if not isinstance(got, torch.Tensor) or got.dtype != torch.float32:
                dtype = got.dtype if isinstance(got, torch.Tensor) else type(got).__name__
                return _fail(r, f"master {k}'s gradient is {dtype}: it must be float32 (cast, "
                                f"then divide by the scale)")
            if not torch.allclose(got, want, rtol=1e-6, atol=0, equal_nan=True):
                mistakes = {scale: "master.grad is the scaled gradient: divide by the loss "
                                   "scale, or the optimizer steps with scaled gradients",
                            1 / scale: "master.grad is divided by the loss scale twice "
                                       "(unscaling twice)"}
                why = next((m for f, m in mistakes.items()
                            if torch.allclose(got, want * f, rtol=1e-5, equal_nan=True)), None)
                return _fail(r, f"master {k}'s gradient on rank {rank}: "
                                f"{why or describe(got, want)} (scale {scale:g})")
    any_bad = bad is not None
    if len(set(found)) > 1:
        says = ", ".join(f"rank {k} {'found' if f else 'did not find'} one"
                         for k, f in enumerate(found))
        return _fail(r, f"the ranks disagree on the inf/NaN ({says}): checking inf on one rank "
                        f"only, each rank decides alone, so one skips the step while another "
                        f"steps; all-reduce the flag (MAX) so every rank skips the same step")
    if found[0] != any_bad:
        return _fail(r, f"unscale_ returned {found[0]}; rank {bad[0]} holds "
                        f"{bad[1]}" if any_bad else f"unscale_ returned {found[0]} for finite "
                        f"gradients")
    for rank in range(r.world_size):
        t = r.traffic[rank]  # the whole case (the courier's bounds): unscale_ only
        if r.world_size > 1 and (t.calls != {"all_reduce": 1}
                                 or t.ops[0].nbytes > FLAG_BYTES):
            what = t.calls or "no collectives"
            return _fail(r, f"rank {rank} made {what} ({t.collective_bytes} bytes) in "
                            f"unscale_: expected one all-reduce of the inf/NaN flag, at most "
                            f"{FLAG_BYTES} bytes (one number, or two float64s)")
    return tr.judge_unscale_contents(r) or Verdict(True)


def judge_reduce(r: CaseResult) -> Verdict:
    c, p = r.case, r.world_size
    none = c.get("none")
    grads = [[g.to(torch.bfloat16).double() for g in i["g"]] for i in r.inputs]
    numel = 0
    for k in range(len(c["shapes"])):
        mean = sum(g[k] for g in grads) / p
        if k != none:
            numel += mean.numel()
        for rank, o in enumerate(r.outputs):
            got = o["grads"][k]
            if k == none:
                if got is not None:
                    return _fail(r, f"parameter {k} had no gradient; after the all-reduce it "
                                    f"has one (leave it out)")
                continue
            want = mean.to(torch.bfloat16)
            if not (isinstance(got, torch.Tensor) and got.dtype == torch.bfloat16):
                return _fail(r, f"gradient {k} on rank {rank}: {describe(got, want)} (the "
                                f"gradients keep their own dtype)")
            tol = 2 ** -7 * float(max(g[k].abs().max() for g in grads))
            if not torch.allclose(got.double(), mean, rtol=2 ** -7, atol=tol):
                summed = torch.allclose(got.double(), mean * p, rtol=2 ** -6, atol=p * tol)
                why = (f"{p}× the mean: summed, not averaged (divide by the world size)"
                       if summed else describe(got, want))
                return _fail(r, f"gradient {k} on rank {rank}: {why}")
    for rank in range(p):
        # The whole case, whose bounds are the courier's (it hands out the case and takes the
        # output): the case is one all_reduce_gradients call, so no mark can move a call out.
        ops = [op for op in r.traffic[rank].ops if op.op == "all_reduce"]
        if len(ops) != 1:
            return _fail(r, f"rank {rank} made {len(ops)} all-reduces: flatten every gradient "
                            f"into one bf16 buffer and all-reduce it once")
        nbytes, dtype = ops[0].nbytes, ops[0].dtype
        if nbytes != 2 * numel or dtype != "bfloat16":
            which = " (float32: cast the buffer to bfloat16)" if nbytes == 4 * numel else ""
            return _fail(r, f"rank {rank}'s all-reduce passed {nbytes} bytes of {dtype}, "
                            f"expected 2 per gradient element, {2 * numel} of bfloat16 (half of "
                            f"fp32's {4 * numel}){which}")
    return tr.judge_reduce_contents(r) or Verdict(True)


def judge_train(r: CaseResult) -> Verdict:
    c = r.case
    skip = ex.skipped(c)
    want_scales = ex.scales(c, skip)
    ref, w0 = ex.trajectory(r), ex.start(r)
    first = next((t for t, s in enumerate(skip) if not s), None)
    for rank, o in enumerate(r.outputs):
        hist = o["history"]
        stepped = [h["stepped"] for h in hist]
        if stepped != [not s for s in skip]:
            where = [t for t, s in enumerate(skip) if s]
            return _fail(r, f"rank {rank} returned stepped = {stepped}; an overflow on rank(s) "
                            f"{sorted({q for _, q in c.get('overflow', [])})} at step(s) {where} "
                            f"must make every rank skip exactly those steps")
        got_scales = [h["scale"] for h in hist]
        if got_scales != want_scales:
            return _fail(r, f"rank {rank}'s loss scale after each step is {got_scales}, "
                            f"expected {want_scales}")
        for t, h in enumerate(hist):
            kinds = {m.dtype if isinstance(m, torch.Tensor) else type(m).__name__
                     for m in h["masters"]}
            if kinds != {torch.float32}:
                return _fail(r, f"the masters are {sorted(map(str, kinds))} ({NOT_KEPT}): "
                                f"float32 tensors expected")
            moved = ex.distance(ref[t], w0)
            err = ex.distance(h["masters"], ref[t])
            if not err <= ex.TOLERANCE * moved + 1e-6:
                why = None
                if first is not None:  # how far the first step taken went, against the ref's
                    before = hist[first - 1]["masters"] if first else w0
                    want_before = ref[first - 1] if first else w0
                    ratio = ex.step_ratio(before, hist[first]["masters"], want_before, ref[first])
                    why = ex.name_step(ratio, c["init_scale"])
                why = why or (
                    f"max error {err:.3g} against the float64 reference, which has moved "
                    f"{moved:.3g} from the start (tolerance {ex.TOLERANCE:.0%} of that)")
                return _fail(r, f"masters on rank {rank} after step {t}: {why}")
            working = ex.rounded(h["masters"])
            if not all(torch.equal(a, b) for a, b in zip(h["working"], working)):
                return _fail(r, f"rank {rank}'s working weights after step {t} are not its "
                                f"masters rounded to bfloat16 (copy_to_working after the step)")
    for rank, o in enumerate(r.outputs[1:], 1):
        mine, zero = o["history"][-1]["masters"], r.outputs[0]["history"][-1]["masters"]
        if not all(torch.equal(a, b) for a, b in zip(mine, zero)):
            return _fail(r, f"rank {rank}'s masters differ from rank 0's: the replicas split")
    # What every all-reduce carried (traffic.py): right values from all-reduces of zeros mean
    # the gradients travelled some other way (red team 8: futexes on a shared library)
    return tr.judge_train_contents(r) or Verdict(True)


def _gradient_op(op, psi: int) -> bool:
    """The gradient all-reduce: Ψ bf16 values, with up to FLAG_BYTES of flags riding along."""
    return op.dtype == "bfloat16" and 2 * psi <= op.nbytes <= 2 * psi + FLAG_BYTES


def judge_train_bytes(r: CaseResult) -> Verdict:
    """The case's all-reduces, all of them (the courier's bounds, not the harness's marks):
    per step one gradient all-reduce of 2Ψ bytes of bf16 (plus at most FLAG_BYTES of a flag
    riding in the same buffer, as torch's DDP with GradScaler lets an inf travel in the
    gradients), and at most one flag all-reduce of at most FLAG_BYTES; nothing else. The
    sections only say which step a wrong one was in (feedback)."""
    values = judge_train(r)
    if not values.passed:
        return values
    psi, steps = r.case["d_out"] * (r.case["d_in"] + 1), r.case["steps"]
    want = (f"{2 * psi} bytes of bfloat16 (Ψ = {psi} parameters; a flag of up to {FLAG_BYTES} "
            "bytes may ride along)")
    for rank in range(r.world_size):
        t = r.traffic[rank]
        ops = [op for op in t.ops if op.op == "all_reduce"]
        grads = [op for op in ops if _gradient_op(op, psi)]
        flags = [op for op in ops if op.nbytes <= FLAG_BYTES]
        known = {id(op) for op in grads + flags}
        wrong = next((op for op in ops if id(op) not in known), None)
        if wrong is not None:
            where = next((f" in step {k}" for k in range(steps)
                          if any(o is wrong for o in t.section(f"step{k}").ops)), "")
            why = (" (float32: cast the buffer to bfloat16)" if wrong.nbytes >= 4 * psi
                   and wrong.dtype != "bfloat16" else "")
            return _fail(r, f"rank {rank}'s all-reduce{where}: {wrong.nbytes} bytes of "
                            f"{wrong.dtype}; the gradients travel as one bf16 buffer of {want}, "
                            f"the inf/NaN flag as at most {FLAG_BYTES} bytes{why}")
        if len(grads) != steps:
            return _fail(r, f"rank {rank} made {len(grads)} gradient all-reduces in {steps} "
                            f"steps; expected one per step ({want}): flatten every gradient "
                            "into one bf16 buffer and all-reduce it once")
        if len(flags) > steps:
            return _fail(r, f"rank {rank} made {len(flags)} all-reduces of at most "
                            f"{FLAG_BYTES} bytes in {steps} steps; one inf/NaN flag per step "
                            "is enough (all-reduce both flags together, or let the inf ride in "
                            "the gradients)")
    return Verdict(True)


TRAIN = {"d_in": 6, "d_out": 3, "batch": 4, "steps": 4, "lr": 0.05, "init_scale": 1024.0,
         "growth_interval": 1000}

CHECKS = [
    Check("master_copy and copy_to_working: fp32 copies, rounded back into bf16 in place", 4,
          "masters", (case("masters", 2, 0, shapes=[[3, 4], [4]]),), judge_masters,
          about="Masters equal the working weights exactly, in float32, in their own memory."),
    Check("LossScaler: scale_loss, backoff, growth, state dict round trip", 6, "scaler",
          (case("scaler", 1, 0, init_scale=2.0 ** 16, growth_interval=3,
                flags=[False, False, False, True, False, False, False, False], split=5),),
          judge_scaler, about="Scales after each update against torch's GradScaler rule."),
    Check("LossScaler.unscale_: fp32 grad / s, an inf on one rank found on every rank", 8,
          "unscale", (case("unscale", 2, 0, shapes=[[3, 5], [5]], scale=1024.0, bad=[1, "inf"]),
                      case("unscale", 4, 1, shapes=[[4, 2], [2]], scale=256.0, bad=None)),
          judge_unscale, timeout=30,
          about="One all-reduce of the inf/NaN flag (at most 16 bytes), counted by the "
                "courier."),
    Check("all_reduce_gradients: the mean, one all-reduce of 2 bytes per element", 8, "reduce",
          (case("reduce", 2, 0, shapes=[[4, 6], [6], [3]]),
           case("reduce", 4, 1, shapes=[[5, 3], [3]])),
          judge_reduce, timeout=30,
          about="Bytes recorded by the grader's courier: half of fp32's."),
    Check("train_step: masters follow float64 SGD, working weights their bf16 rounding", 8,
          "train", (case("train", 2, 0, **TRAIN),), judge_train, timeout=60,
          about=f"Every step within {ex.TOLERANCE:.0%} of the reference's distance moved."),
    Check("train_step: an overflow on one rank skips that step on every rank", 6, "train",
          (case("train", 2, 1, **{**TRAIN, "overflow": [[1, 1]]}),), judge_train, timeout=60,
          about="Stepped flags, scale halved, masters untouched by the skipped step."),
]
