"""Lab 02's visible checks (students have these) and the judges the hidden ones reuse.

Judges run in the grader. Expected parameters come from training rank 0's initial model in one
process, in float64, on the whole batch with plain SGD: every rank had an equal slice, so DDP
must apply the *mean* of the ranks' gradients (Li et al., "PyTorch Distributed", VLDB 2020).
Buckets are the course's rule (`toolkit.data_parallel.buckets.assign_buckets`, trusted code run
here, never in the ranks): reverse parameter order, a bucket closes once it holds the cap. Traffic
is what the grader's courier saw in each step's sections (`harness._step`): one all-reduce per
bucket, each carrying one bucket's bytes, as many in all as the trainable parameters (frozen
ones not sent, a tied weight sent once); barriers are allowed and, like zero-byte calls, not
counted. `assign_buckets` is judged on the case's sizes and caps, one row per pair: a rank's
rows say nothing about what is judged. An all-reduce overlapped with backward when it
reached the courier before the synchronised backward's gate: the round trip whose answer s_n
(from the grade's secret, `autograder.sandbox.gate`) the first layer's gradients are scaled by
(`harness.Gate`), so they cannot exist before it, and the expected parameters apply the same
s_n per micro-batch. It finished in time when the rank waited on it, saw it complete, or asked
for its future before backward returned (the rank's word: a rank that did not wait has wrong
values anyway, unless its all-reduces happened to complete).
"""

from __future__ import annotations

import itertools
from collections import Counter

import torch
import torch.nn.functional as F

from _lab_harness import (LR, install_gate, make_model,  # the lab's harness.py
                          micro_batches, uses_side)
from autograder.lab import CaseResult, Check, LabInfo, Verdict, one_row_each
from autograder.sandbox.gate import LOCAL_KEY, scale
from toolkit.data_parallel.buckets import assign_buckets

LAB = LabInfo(
    slug="02_ddp",
    title="Lab 02: DDP from scratch (buckets, overlap, no_sync)",
    student_files=("ddp.py",),
    names=("assign_buckets", "broadcast_from_rank0", "DDP"),
    forbidden_imports=("toolkit.data_parallel",),
    allowed_collectives=("all_reduce", "broadcast", "barrier"),
    sandbox_modules=("models",),
)

DEFAULT_CAP = 25 * 2**20  # bytes: DDP's default bucket_cap_mb = 25
GENERIC = "check which slice of which bucket each parameter uses"


def cases(*specs: dict, seed: int = 0, **extra) -> tuple[dict, ...]:
    """One case per spec (world_size, model, ...), each with its own seed."""
    return tuple({"seed": seed + k, "model": "toy", **extra, **spec}
                 for k, spec in enumerate(specs))


def _label(r: CaseResult) -> str:
    c = r.case
    bits = [f"{r.world_size} ranks", "TinyMLP" if c.get("model") == "mlp" else "toy model"]
    bits += ["tied weight"] if c.get("tied") else []
    bits += [f"frozen {', '.join(c['frozen'])}"] if c.get("frozen") else []
    bits += ["side branch used in step 0 only"] if c.get("side") else []
    bits += [f"bucket cap {c['cap']} bytes"] if "cap" in c else ["default bucket cap"]
    bits += [f"{c['accumulate']} micro-batches per step"] if c.get("accumulate", 1) > 1 else []
    return ", ".join(bits)


def reference(case: dict, *, grad_scale: float = 1.0) -> dict[str, torch.Tensor]:
    """Rank 0's initial model trained in one process, float64, on the whole batch, with the
    gates the ranks were answered: micro-batch j of step t (every rank's j-th, together) passes
    its first layer's gradient through s_{t·k + j} (`harness.Gate`; k micro-batches a step,
    the n-th gate of each rank answered alike). The whole batch's mean loss is the mean of the
    k micro-batches' (equal sizes), so this is what DDP with no_sync() must reach. A
    `grad_scale` of world_size gives what a run that *sums* gradients over ranks reaches."""
    model = make_model(case, 0).double()
    p, k = int(case.get("world_size", 1)), int(case.get("accumulate", 1))
    per_rank = [micro_batches(case, r, p) for r in range(p)]
    parts = [[torch.cat([mb[j][i] for mb in per_rank]).double() for i in (0, 1)]
             for j in range(k)]  # micro-batch j of every rank: (x, y)
    key, asked = case.get("gate_key") or LOCAL_KEY, itertools.count()
    install_gate(model, lambda: scale(key, next(asked)))
    params = [q for q in model.parameters() if q.requires_grad]
    for step in range(int(case.get("steps", 3))):
        for q in params:
            q.grad = None
        use = {"use_side": True} if uses_side(case, step) else {}
        for x, y in parts:
            (grad_scale * F.mse_loss(model(x, **use), y) / k).backward()
        with torch.no_grad():
            for q in params:
                if q.grad is not None:
                    q.add_(q.grad, alpha=-LR)
    return {name: v.detach() for name, v in model.state_dict().items()}


def _close(got, want: torch.Tensor) -> bool:
    return (isinstance(got, torch.Tensor) and got.shape == want.shape
            and torch.allclose(got.double(), want.double(), rtol=1e-4, atol=2e-5))


def _mismatch(states: list, want: dict) -> tuple[int, str] | None:
    """(rank, name) of the first entry that differs, or None."""
    for rank, state in enumerate(states):
        for name, value in want.items():
            if not isinstance(state, dict) or not _close(state.get(name), value):
                return rank, name
    return None


def _outputs(r: CaseResult) -> list[dict] | None:
    ok = all(isinstance(o, dict) and isinstance(o.get("final"), dict) for o in r.outputs)
    return r.outputs if ok else None


def _counted(ops) -> list:
    """The ops that move data: barriers are allowed anywhere, and a zero-byte collective
    carries nothing (counting it would let empty all-reduces stand in for buckets)."""
    return [o for o in ops if o.op != "barrier" and o.nbytes > 0]


def steps(r: CaseResult, rank: int) -> list[dict]:
    """Rank `rank`'s steps as the courier saw them: per step, its calls (barriers and zero-byte
    calls left out, `_counted`) and bytes, and each all-reduce as [position, finished before
    backward returned, async, bytes], the position of the synchronised backward's gate (None
    when it asked none), and what was sent inside no_sync()."""
    t, out = r.traffic[rank], []
    for step in range(int(r.case.get("steps", 3))):
        sync, quiet = t.section(f"sync{step}"), t.section(f"quiet{step}")
        ops, quiet_ops = _counted(sync.ops), _counted(quiet.ops)
        end = t.position(f"sync{step}:end")
        ars = [[t.position(o), o.observed and o.observed_at is not None
                and end is not None and o.observed_at <= end, o.async_op, o.nbytes]
               for o in ops if o.op == "all_reduce"]
        gate = t.position(sync.gates[0]) if sync.gates else None
        out.append({"calls": dict(Counter(o.op for o in ops)),
                    "bytes": sum(o.nbytes for o in ops),
                    "all_reduces": ars, "gate": gate,
                    "quiet_calls": dict(Counter(o.op for o in quiet_ops)),
                    "quiet_bytes": sum(o.nbytes for o in quiet_ops)})
    return out


def bucket_bytes(case: dict) -> list[int]:
    """Bytes of each bucket of the case's model (`expected_buckets`), in bucket order."""
    params = [p for p in make_model(case, 0).parameters() if p.requires_grad]
    return [sum(params[i].numel() * params[i].element_size() for i in b)
            for b in expected_buckets(case)]


def _in_flight(r: CaseResult) -> tuple[int, int] | None:
    """(rank, step) where an all-reduce had not finished when loss.backward() returned."""
    for rank in range(r.world_size):
        for step, s in enumerate(steps(r, rank)):
            if any(not e[1] for e in s["all_reduces"]):
                return rank, step
    return None


def judge_train(r: CaseResult) -> Verdict:
    outs = _outputs(r)
    if outs is None:
        return Verdict(False, f"no training result came back ({_label(r)})")
    p, label = r.world_size, _label(r)
    init = make_model(r.case, 0).state_dict()
    bad = _mismatch([o["after_init"] for o in outs], init)
    if bad is not None:
        rank, name = bad
        buffers = {n for n, _ in make_model(r.case, 0).named_buffers()}
        wrong = [n for n, v in init.items() if not _close(outs[rank]["after_init"].get(n), v)]
        name = next((n for n in wrong if n not in buffers), name)  # parameters first
        if rank == 0:
            return Verdict(False, f"DDP(...) changed rank 0's {name} at construction ({label}): "
                                  "rank 0's values are the ones every rank should copy")
        if name in buffers:
            return Verdict(False, f"after DDP(...), rank {rank}'s buffer {name} differs from rank "
                                  f"0's ({label}): broadcast the module's buffers too, not only "
                                  "its parameters")
        return Verdict(False, f"after DDP(...), rank {rank}'s {name} differs from rank 0's "
                              f"({label}): the ranks start from different weights. Broadcast "
                              "rank 0's parameters and buffers in DDP.__init__")
    want = reference(r.case)
    bad = _mismatch([o["final"] for o in outs], want)
    if bad is None:
        return Verdict(True)
    rank, name = bad
    n_steps = int(r.case.get("steps", 3))
    where = (f"after {n_steps} steps, rank {rank}'s {name} differs from single-process training "
             f"({label})")
    flight = _in_flight(r)
    if flight is not None:
        return Verdict(False, f"{where}: in step {flight[1]}, rank {flight[0]} still had an "
                              "all-reduce in flight when loss.backward() returned. Wait for "
                              "every handle in finish() before copying gradients out")
    if p > 1 and _mismatch([o["final"] for o in outs], reference(r.case, grad_scale=p)) is None:
        return Verdict(False, f"the parameters match gradients *summed* over the {p} ranks "
                              f"({label}): divide the all-reduced buckets by the world size to "
                              "average them")
    n_buckets = len(expected_buckets(r.case))
    branch = " (the side branch after step 0)" if r.case.get("side") else ""
    for q in range(p):
        for step, st in enumerate(steps(r, q)):
            sent = st["calls"].get("all_reduce", 0)
            if sent < n_buckets:
                return Verdict(False, f"{where}: in step {step}, rank {q} made {sent} "
                                      f"all-reduce(s) for {n_buckets} bucket(s). A bucket that "
                                      f"holds a parameter without gradient this step{branch} "
                                      "never fills: finish() must put zeros in its slot and "
                                      "start it")
    if name in r.case.get("frozen", ()):
        return Verdict(False, f"{where}: a frozen parameter (requires_grad=False) changed; "
                              "leave frozen parameters out of the buckets")
    if name.startswith("side") and r.case.get("side"):
        return Verdict(False, f"{where}: that parameter gets no gradient after step 0. Its "
                              "bucket must still be all-reduced in finish(), with zeros in its "
                              "slot, and its .grad set to the average")
    return Verdict(False, f"{where}: {GENERIC}, and that every .grad is overwritten by its "
                          "bucket's average")


def expected_buckets(case: dict) -> list[list[int]]:
    params = [p for p in make_model(case, 0).parameters() if p.requires_grad]
    return assign_buckets(params, int(case.get("cap", DEFAULT_CAP)))


def judge_traffic(r: CaseResult) -> Verdict:
    values = judge_train(r)
    if not values.passed:
        return values
    model = make_model(r.case, 0)
    params = [p for p in model.parameters() if p.requires_grad]
    n_buckets, n_params = len(expected_buckets(r.case)), len(params)
    cap = int(r.case.get("cap", DEFAULT_CAP))
    trainable = sum(p.numel() * p.element_size() for p in params)
    want_each, label = bucket_bytes(r.case), _label(r)
    for rank in range(r.world_size):
        for step, s in enumerate(steps(r, rank)):
            calls, nbytes = s["calls"], s["bytes"]
            at = f"rank {rank}, step {step} ({label})"
            others = {op: n for op, n in calls.items() if op != "all_reduce"}
            if others:
                return Verdict(False, f"{at}: forward+backward called {others}; DDP needs only "
                                      "one all-reduce per bucket")
            got = calls.get("all_reduce", 0)
            if got != n_buckets:
                hint = " Check assign_buckets and that each bucket is all-reduced exactly once"
                if got == n_params:
                    hint = (" That is one per parameter: pack the gradients into buckets and "
                            "all-reduce each bucket's flat buffer once")
                elif got == len(assign_buckets(params[::-1], cap)):
                    hint = (" That is the count of buckets filled in forward order: walk the "
                            "parameters from the last to the first")
                return Verdict(False, f"{at}: {got} all-reduces; the {n_params} trainable "
                                      f"parameters make {n_buckets} bucket(s).{hint}")
            if nbytes != trainable:
                return Verdict(False, f"{at}: the all-reduces carried {nbytes:,} bytes; the "
                                      f"trainable parameters hold {trainable:,}."
                                      f"{_bytes_hint(model, nbytes)}")
            got_each = sorted(e[3] for e in s["all_reduces"])
            if got_each != sorted(want_each):
                return Verdict(False, f"{at}: the all-reduces carried {got_each} bytes (sorted); "
                                      f"the buckets hold {sorted(want_each)}. Each all-reduce "
                                      "carries one whole bucket's flat buffer")
    return Verdict(True)


def _bytes_hint(model: torch.nn.Module, nbytes: int) -> str:
    """The usual mistake that makes all-reduces carry `nbytes` instead of the trainable
    parameters' bytes, as a sentence ("" when none explains it). Bytes are counted with each
    tensor's own element size; a tied weight is found as one tensor under several names."""
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


def judge_order(r: CaseResult) -> Verdict:
    """Traffic, then each all-reduce (in start order) carries bucket i's bytes: reverse order."""
    values = judge_traffic(r)
    if not values.passed:
        return values
    want = bucket_bytes(r.case)
    for rank in range(r.world_size):
        for step, s in enumerate(steps(r, rank)):
            got = [e[3] for e in sorted(s["all_reduces"], key=lambda e: e[0])]
            if got != want:
                return Verdict(False, f"rank {rank}, step {step} ({_label(r)}): the all-reduces "
                                      f"carried {got} bytes in turn; the buckets hold {want}. "
                                      "Buckets go in reverse parameter order (the last layer's "
                                      "gradients are ready first) and start in index order")
    return Verdict(True)


def judge_overlap(r: CaseResult) -> Verdict:
    """Traffic first (every all-reduce one whole bucket), then: bucket 0's all-reduce (the
    last layer's, full first) reached the courier before the first layer's gate, async, and
    every all-reduce was waited on before backward returned."""
    values = judge_traffic(r)
    if not values.passed:
        return values
    label, first = _label(r), bucket_bytes(r.case)[0]
    for rank in range(r.world_size):
        for step, s in enumerate(steps(r, rank)):
            at, gate = f"rank {rank}, step {step} ({label})", s.get("gate")
            events = s["all_reduces"]
            if gate is None:
                return Verdict(False, f"{at}: backward never computed the first layer's "
                                      "gradient")
            early = [e for e in events if e[0] < gate]
            if not early:
                return Verdict(False, f"{at}: all {len(events)} all-reduces started after "
                                      "backward had reached the first layer: no overlap. Start "
                                      "a bucket's all-reduce from the gradient hook "
                                      "(grad_ready) as soon as the bucket is full; bucket 0 "
                                      "(the last layer's parameters) fills first")
            if not any(e[3] == first for e in early):
                return Verdict(False, f"{at}: the all-reduces started during backward carried "
                                      f"{[e[3] for e in early]} bytes; bucket 0 (the last "
                                      f"layer's parameters, {first:,} bytes) fills first and "
                                      "must start before backward reaches the first layer")
            if not all(e[2] for e in early):
                return Verdict(False, f"{at}: an all-reduce started during backward blocks it "
                                      "(async_op=False). Use dist.all_reduce(buf, async_op=True) "
                                      "and wait for the handles in finish()")
            if not all(e[1] for e in events):
                return Verdict(False, f"{at}: an all-reduce was still in flight when "
                                      "loss.backward() returned: the rank had not waited on it "
                                      "(wait(), is_completed() returning True, or its future "
                                      "through get_future()). finish() must wait for every "
                                      "handle before copying the averages into .grad")
    return Verdict(True)


def judge_no_sync(r: CaseResult) -> Verdict:
    outs = _outputs(r)
    if outs is None:
        return Verdict(False, f"no training result came back ({_label(r)})")
    for rank in range(r.world_size):
        for step, s in enumerate(steps(r, rank)):
            if s["quiet_calls"]:
                return Verdict(False, f"rank {rank}, step {step} ({_label(r)}): inside no_sync() "
                                      f"forward+backward called {s['quiet_calls']} "
                                      f"({s['quiet_bytes']:,} bytes); nothing may be sent there")
    values = judge_train(r)
    if values.passed or GENERIC not in values.message:
        return values
    return Verdict(False, values.message + ". With no_sync(), .grad holds the sum of the "
                   "micro-batches' gradients when the last backward starts: that sum is what "
                   "the buckets must carry")


# -- assign_buckets (pure) -----------------------------------------------------------------

def _bucket_rows(case: dict) -> list[tuple[list[int], int]]:
    """The (sizes, cap) pairs the case asks for, in the order `harness._buckets` answers them:
    the grader's own list, so a rank cannot choose what is judged (nor how big)."""
    return [(list(sizes), int(cap)) for sizes in case["sizes"] for cap in case["caps"]]


def _is_buckets(got) -> bool:
    return isinstance(got, list) and all(
        isinstance(b, list) and all(type(i) is int for i in b) for b in got)


def judge_buckets(r: CaseResult) -> Verdict:
    """One row per (sizes, cap) of the case, in order; only each row's ``buckets`` is read."""
    rows, want_rows = r.outputs[0], _bucket_rows(r.case)
    wrong = one_row_each(rows, len(want_rows), "(sizes, cap) pair")
    if wrong is not None:
        return wrong
    for row, (sizes, cap) in zip(rows, want_rows):
        got = row.get("buckets")
        want = assign_buckets([torch.zeros(n) for n in sizes], cap)  # the case's sizes: small
        if got != want:
            nbytes = [4 * n for n in sizes]
            forward = assign_buckets([torch.zeros(n) for n in sizes[::-1]], cap)
            hint, n = "", len(sizes)
            if _is_buckets(got) and got == [[n - 1 - i for i in b] for b in forward]:
                hint = " Those are buckets in forward order: walk from the last parameter."
            return Verdict(False, f"assign_buckets(parameters of {nbytes} bytes, cap_bytes="
                                  f"{cap}) gave {str(got)[:200]}, expected {want}.{hint} "
                                  "A bucket closes as soon as it holds cap_bytes or more.")
    return Verdict(True)


TOY = {"tied": True, "frozen": ["a.bias"], "side": True, "cap": 100}
MLP = {"model": "mlp", "cap": 200}

CHECKS = [
    Check("assign_buckets: reverse parameter order, a bucket closes once it holds the cap", 6,
          "buckets", ({"world_size": 1, "sizes": [[100, 100, 300], [5, 7, 3, 11]],
                       "caps": [1000, 1, 40, 10**9]},), judge_buckets,
          about="Pure function, one rank: tensors of float32, caps in bytes."),
    Check("DDP: after 3 steps every rank equals single-process training on the whole batch", 12,
          "train", cases({"world_size": 2, **TOY}, {"world_size": 2, "model": "mlp"}),
          judge_train, about="Ranks start from different weights; a tied weight, a frozen "
                             "bias, a parameter without gradient in steps 1-2; float64 reference."),
    Check("DDP: one all-reduce per bucket, bytes per step = trainable parameter bytes", 8,
          "train", cases({"world_size": 2, **TOY}, {"world_size": 2, **MLP}, seed=10, steps=2),
          judge_traffic, about="Counted per step by the recorder (the broadcast at construction "
                               "is not part of a step)."),
    Check("DDP: an all-reduce starts during backward (async), all finish before it returns", 8,
          "train", cases({"world_size": 2, **MLP}, seed=20, steps=2), judge_overlap,
          about="Traffic first; then bucket 0's all-reduce against the moment backward asked "
                "the grader for the scale of the first layer's gradient."),
    Check("no_sync(): sends nothing; accumulated steps equal single-process training", 6,
          "train", cases({"world_size": 2, **TOY, "side": False, "accumulate": 2}, seed=30,
                         steps=2), judge_no_sync,
          about="Two micro-batches per step, the first inside no_sync()."),
]
