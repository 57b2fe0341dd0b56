"""Lab 02's visible checks (students have these) and the judges the hidden ones reuse; the
single-process reference and the gradients each all-reduce must carry are in expected.py, the
courier-record judges in traffic.py.

Judges run in the grader. Expected parameters come from training rank 0's initial model in one
process, in float64, on the whole batch with plain SGD: every rank had an equal slice, so DDP
must apply the *mean* of the ranks' gradients (Li et al., "PyTorch Distributed", VLDB 2020).
Traffic is judged over the whole case from the courier's record (traffic.py): one all-reduce
per bucket and step, each carrying that bucket's gradient as the rank's backward left it, so
the traffic checks judge traffic whatever the values (a missing division fails the values
checks only). An all-reduce overlapped with backward when it reached the courier before the
synchronised backward's gate: the round trip whose answer s_n (from the grade's secret,
`autograder.sandbox.gate`) the first layer's gradients are scaled by (`harness.Gate`), so they
cannot exist before it. It finished in time when the rank waited on it, saw it complete, or
asked for its future before backward returned (the rank's word, bounded by the next step's
first gate: a rank that did not wait has wrong values anyway, unless its all-reduces happened
to complete). `assign_buckets` is judged on the case's sizes and caps, one row per pair: a
rank's rows say nothing about what is judged.
"""

from __future__ import annotations

from pathlib import Path

import torch

from _lab_harness import make_model  # the lab's harness.py
from autograder.lab import CaseResult, Check, LabInfo, Verdict, one_row_each
from autograder.outputs import FLOATS, Seq, state_form
from autograder.sandbox.rank import load_module
from toolkit.data_parallel.buckets import assign_buckets

# This folder's expected.py and traffic.py, loaded by path as the grader loads every lab file.
ex = load_module(Path(__file__).with_name("expected.py"), "_autograder_lab_02_expected")
tr = load_module(Path(__file__).with_name("traffic.py"), "_autograder_lab_02_traffic")
DEFAULT_CAP, bucket_bytes, expected_buckets, reference = (ex.DEFAULT_CAP, ex.bucket_bytes,
                                                          ex.expected_buckets, ex.reference)
_label, rank_steps = tr.label, tr.rank_steps

LAB = LabInfo(
    slug="02_ddp",
    title="Lab 02: DDP from scratch (buckets, overlap, no_sync)",
    student_files=("ddp.py",),
    names=("assign_buckets", "broadcast_from_rank0", "DDP"),
    forbidden_imports=("toolkit.data_parallel",),
    allowed_collectives=("all_reduce", "broadcast", "barrier"),
    sandbox_modules=("models",),
)
GENERIC = "check which slice of which bucket each parameter uses"


def _train_form(case: dict, inputs, rank: int, world_size: int) -> dict:
    state = state_form(make_model(case, rank).state_dict(), FLOATS)
    return {"after_init": state, "before": Seq(state, int(case.get("steps", 3))),
            "final": state}


def _buckets_form(case: dict, inputs, rank: int, world_size: int) -> Seq:
    rows = len(case["sizes"]) * len(case["caps"])
    return Seq({"buckets": Seq(Seq(int))}, rows)


# What each call's harness returns (`autograder.outputs`), checked before any judge reads it.
OUTPUTS = {"train": _train_form, "buckets": _buckets_form}


def cases(*specs: dict, seed: int = 0, **extra) -> tuple[dict, ...]:
    """One case per spec (world_size, model, ...), each with its own seed."""
    return tuple({"seed": seed + k, "model": "toy", **extra, **spec}
                 for k, spec in enumerate(specs))


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


def _in_flight(r: CaseResult) -> tuple[int, int] | None:
    """(rank, step) where an all-reduce had not been waited on when backward returned (from a
    rank whose traffic adds up; the others' is named by the traffic checks)."""
    for rank in range(r.world_size):
        steps, bad = rank_steps(r, rank)
        for step, s in enumerate(steps if bad is None else []):
            if any(not _finished(o, s) for o in s.all_reduces):
                return rank, step
    return None


def _finished(op, s) -> bool:
    return op.observed and op.observed_at is not None and op.observed_at <= s.end


def judge_train(r: CaseResult) -> Verdict:
    """The values: every rank's weights after DDP(...) equal rank 0's initial ones, and after
    the case's steps equal single-process training (`expected.reference`); a wrong result is
    explained by the usual mistake that fits (summed, in flight, a missing bucket, ...)."""
    outs, p, label = r.outputs, r.world_size, _label(r)
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
    bad = _mismatch([o["final"] for o in outs], reference(r.case))
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
    for q in range(p):
        sent = len([o for o in tr.counted(r.traffic[q].ops) if o.op == "all_reduce"])
        if sent < n_steps * n_buckets and r.case.get("side"):
            return Verdict(False, f"{where}: rank {q} made {sent} all-reduce(s) in {n_steps} "
                                  f"steps for {n_buckets} bucket(s). A bucket that holds a "
                                  "parameter without gradient this step (the side branch after "
                                  "step 0) never fills: finish() must put zeros in its slot "
                                  "and start it")
    if name in r.case.get("frozen", ()):
        return Verdict(False, f"{where}: a frozen parameter (requires_grad=False) changed; "
                              "leave frozen parameters out of the buckets")
    if name.startswith("side") and r.case.get("side"):
        return Verdict(False, f"{where}: that parameter gets no gradient after step 0. Its "
                              "bucket must still be all-reduced in finish(), with zeros in its "
                              "slot, and its .grad set to the average")
    return Verdict(False, f"{where}: {GENERIC}, and that every .grad is overwritten by its "
                          "bucket's average")


def judge_traffic(r: CaseResult) -> Verdict:
    """Traffic whatever the values: per rank and step, one all-reduce per bucket carrying
    that bucket's gradient, from the courier's record of the whole case (traffic.py)."""
    for rank in range(r.world_size):
        _, bad = rank_steps(r, rank)
        if bad is not None:
            return bad
    return Verdict(True)


def judge_order(r: CaseResult) -> Verdict:
    """Traffic, then each step's all-reduces carry buckets 0, 1, ... in turn: reverse
    parameter order, started in index order."""
    want = bucket_bytes(r.case)
    for rank in range(r.world_size):
        steps, bad = rank_steps(r, rank)
        if bad is not None:
            return bad
        for step, s in enumerate(steps):
            if s.bucket != list(range(len(want))):
                got = [o.nbytes for o in s.all_reduces]
                return Verdict(False, f"rank {rank}, step {step} ({_label(r)}): the all-reduces "
                                      f"carried buckets {s.bucket} ({got} bytes) in turn; the "
                                      f"buckets hold {want} bytes, started 0, 1, ... Buckets go "
                                      "in reverse parameter order (the last layer's gradients "
                                      "are ready first) and start in index order")
    return Verdict(True)


def judge_overlap(r: CaseResult) -> Verdict:
    """Traffic first (every all-reduce one bucket's gradient), then: bucket 0's all-reduce
    (the last layer's, full first) reached the courier before the synchronised backward's
    gate, async, and every all-reduce was waited on before backward returned."""
    label = _label(r)
    for rank in range(r.world_size):
        steps, bad = rank_steps(r, rank)
        if bad is not None:
            return bad
        for step, s in enumerate(steps):
            at = f"rank {rank}, step {step} ({label})"
            if s.gate is None:
                return Verdict(False, f"{at}: backward never computed the first layer's "
                                      "gradient")
            t = r.traffic[rank]
            early = [(o, b) for o, b in zip(s.all_reduces, s.bucket) if t.position(o) < s.gate]
            if not early:
                return Verdict(False, f"{at}: all {len(s.all_reduces)} all-reduces started after "
                                      "backward had reached the first layer: no overlap. Start "
                                      "a bucket's all-reduce from the gradient hook "
                                      "(grad_ready) as soon as the bucket is full; bucket 0 "
                                      "(the last layer's parameters) fills first")
            if not any(b == 0 for _, b in early):
                return Verdict(False, f"{at}: the all-reduces started during backward carried "
                                      f"buckets {[b for _, b in early]}; bucket 0 (the last "
                                      "layer's parameters) fills first and must start before "
                                      "backward reaches the first layer")
            if not all(o.async_op for o, _ in early):
                return Verdict(False, f"{at}: an all-reduce started during backward blocks it "
                                      "(async_op=False). Use dist.all_reduce(buf, async_op=True) "
                                      "and wait for the handles in finish()")
            if not all(_finished(o, s) for o in s.all_reduces):
                return Verdict(False, f"{at}: an all-reduce was still in flight when "
                                      "loss.backward() returned: the rank had not waited on it "
                                      "(wait(), is_completed() returning True, or its future "
                                      "through get_future()). finish() must wait for every "
                                      "handle before copying the averages into .grad")
    return Verdict(True)


def judge_no_sync(r: CaseResult) -> Verdict:
    """Nothing sent inside no_sync() (every all-reduce of the case is one bucket's
    accumulated gradient, one per bucket and step), then the values."""
    traffic = judge_traffic(r)
    if not traffic.passed:
        return traffic
    values = judge_train(r)
    if values.passed or GENERIC not in values.message:
        return values
    return Verdict(False, values.message + ". With no_sync(), .grad holds the sum of the "
                   "micro-batches' gradients when the last backward starts: that sum is what "
                   "the buckets must carry")


def judge_values_then_order(r: CaseResult) -> Verdict:
    values = judge_train(r)
    return judge_order(r) if values.passed else values


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
    Check("DDP: one all-reduce per bucket and step, each carrying that bucket's gradient", 8,
          "train", cases({"world_size": 2, **TOY}, {"world_size": 2, **MLP}, seed=10, steps=2),
          judge_traffic, about="Counted over the whole case by the grader's courier (the "
                               "broadcast at construction is not part of a step); contents "
                               "against each rank's own gradients, whatever the values."),
    Check("DDP: an all-reduce starts during backward (async), all finish before it returns", 8,
          "train", cases({"world_size": 2, **MLP}, seed=20, steps=2), judge_overlap,
          about="Traffic first; then bucket 0's all-reduce against the moment backward asked "
                "the grader for the scale of the first layer's gradient."),
    Check("no_sync(): sends nothing; accumulated steps equal single-process training", 6,
          "train", cases({"world_size": 2, **TOY, "side": False, "accumulate": 2}, seed=30,
                         steps=2), judge_no_sync,
          about="Two micro-batches per step, the first inside no_sync()."),
]
