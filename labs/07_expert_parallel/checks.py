"""Lab 07's visible checks and the judges the hidden ones reuse.

Capacity: C = ⌈cf·k·T/E⌉ against `toolkit.cost.experts.expert_capacity` on a table of cases
(Switch Transformers eq. 3). Keep: the kept choices exactly as GShard's order gives them (every
first choice before any second one, Algorithm 1), so the dropped count is exact. MoE: on 2-4
real ranks the layer made of the student's capacity, keep, dispatch and combine (the harness
runs router and experts) against the single-process `MoELayer` with one group per rank:
outputs, x's gradient, every expert's gradient and the router's (summed over the ranks) within
`expected.RTOL`/`ATOL` in float64; and the bytes each rank sent, as the courier recorded them,
equal to `toolkit.cost.experts.step_bytes` (counts, then the rows for other ranks, forward and
backward), with no collective and no empty message, one message per non-empty piece; all
of it over the whole case, not between the rank's section marks.
"""

from __future__ import annotations

from pathlib import Path

import torch

from autograder.feedback import describe
from autograder.lab import CaseResult, Check, LabInfo, Verdict
from autograder.outputs import SCALAR, Maybe, Seq, Tensor
from autograder.sandbox.channel import make_tensor
from autograder.sandbox.courier import KEEP_BYTES
from autograder.sandbox.rank import load_module

# This folder's expected.py, loaded by path as the grader loads every lab file.
ex = load_module(Path(__file__).with_name("expected.py"), "_autograder_lab_07_expected")

LAB = LabInfo(
    slug="07_expert_parallel",
    title="Lab 07: expert parallelism (capacity, dispatch, combine)",
    student_files=("moe_exchange.py",),
    names=("expert_capacity", "keep", "all_to_all", "Exchange", "dispatch", "combine"),
    forbidden_imports=("toolkit.expert_parallel",),
    allowed_collectives=(),
)


def _capacity_form(case: dict, inputs, rank: int, world_size: int) -> dict:
    return {"capacity": Seq(SCALAR, len(case["table"]))}


def _keep_form(case: dict, inputs: dict, rank: int, world_size: int) -> dict:
    # keep() decides the mask's shape; judge_keep compares shapes first
    return {"kept": Maybe(Tensor(max_numel=4 * inputs["expert"].numel() + 16))}


def _moe_form(case: dict, inputs: dict, rank: int, world_size: int) -> dict:
    t, d = inputs["x"].shape
    return {"y": Tensor((t, d)), "x_grad": Maybe(Tensor((t, d))),
            "router_grad": Tensor(tuple(inputs["router"].shape)),
            "expert_grads": {n: Tensor(tuple(inputs[n].shape)) for n in ("w1", "b1", "w2", "b2")},
            "kept": Tensor(max_numel=4 * t * case["top_k"] + 16), "counts": Seq(SCALAR)}


# What each call's harness returns (`autograder.outputs`), checked before any judge reads it.
OUTPUTS = {"capacity": _capacity_form, "keep": _keep_form, "moe": _moe_form}


def case(kind: str, world_size: int, seed: int, **params) -> dict:
    return {"world_size": world_size, "kind": kind, "seed": seed, **params}


def _fail(r: CaseResult, text: str) -> Verdict:
    return Verdict(False, f"{text} ({r.world_size} ranks)")


def judge_capacity(r: CaseResult) -> Verdict:
    table, got = r.case["table"], r.outputs[0].get("capacity")
    want = ex.capacities(table)
    for (t, e, k, cf), g, w in zip(table, got or [], want):
        if g != w:
            exact = None if cf is None else cf * k * t / e
            why = ""
            if exact is not None and g == int(exact) and g != exact:
                why = ": floor instead of ceil (round up: a partial slot is still a slot)"
            elif g in (w - 1, w + 1):
                why = ": capacity off by one"
            elif cf is None:
                why = ": capacity_factor None means no limit, C = T"
            return _fail(r, f"expert_capacity({t}, {e}, top_k={k}, capacity_factor={cf}) = {g}, "
                            f"expected ⌈cf·k·T/E⌉ = {w}{why}")
    if got is None or len(got) != len(want):
        return _fail(r, "expert_capacity did not answer every row of the table")
    return Verdict(True)


GSHARD = ("GShard's queue takes every token's first choice, tokens in order, before any second "
          "choice")
WRONG_ORDERS = [  # (the queue's order as `ex.kept_in_order` takes it, what the feedback says)
    (dict(token_major=True), "slots counted token by token; GShard's queue takes every token's "
                             "first choice before any second choice"),
    (dict(tokens_backwards=True), "tokens queued from the last one; GShard's queue takes "
                                  "tokens in order t = 0, 1, … (the latest ones are dropped)"),
    (dict(choices_backwards=True), f"later choices queued before first choices; {GSHARD}"),
    (dict(token_major=True, tokens_backwards=True),
     f"slots counted token by token from the last token; {GSHARD}"),
    (dict(tokens_backwards=True, choices_backwards=True),
     f"the queue taken backwards (the last token's last choice first); {GSHARD}"),
]


def why_kept(got: torch.Tensor, expert: torch.Tensor, num_experts: int, capacity: int) -> str:
    """What the kept mask `got` (not GShard's) was made by, when a usual mistake made it."""
    if torch.equal(got, ex.kept(expert, num_experts, capacity + 1)):
        return "capacity off by one: keeps C + 1 per expert (slots count from 0: keep slot < C)"
    for order, why in WRONG_ORDERS:
        if torch.equal(got, ex.kept_in_order(expert, num_experts, capacity, **order)):
            return f"tokens dropped in the wrong order: {why}"
    per_expert = torch.bincount(expert[got], minlength=num_experts)
    if int(per_expert.max(initial=0)) > capacity:
        return f"an expert keeps {int(per_expert.max())} choices, more than the capacity"
    want = ex.kept(expert, num_experts, capacity)
    t, j = (got != want).nonzero()[0].tolist()
    return f"choice {j} of token {t} (expert {int(expert[t, j])}) is " + \
        ("kept" if got[t, j] else "dropped")


def judge_keep(r: CaseResult) -> Verdict:
    c = r.case
    expert = r.inputs[0]["expert"]
    want = ex.kept(expert, c["experts"], c["capacity"])
    got = r.outputs[0].get("kept")
    if not (isinstance(got, torch.Tensor) and got.shape == want.shape):
        return _fail(r, f"keep: {describe(got, want)}")
    got = got.bool()
    if torch.equal(got, want):
        return Verdict(True)
    n_got, n_want = int((~got).sum()), int((~want).sum())
    where = f"dropped {n_got} choices, expected {n_want} (capacity {c['capacity']})"
    return _fail(r, f"keep: {why_kept(got, expert, c['experts'], c['capacity'])}; {where}")


def _values(r: CaseResult, ref: dict) -> Verdict:
    c = r.case
    for rank, o in enumerate(r.outputs):
        routing, kept = ref["routings"][rank], o["kept"].cpu().bool()
        if not torch.equal(kept, routing.kept):
            why = "check keep and expert_capacity"
            if kept.shape == routing.kept.shape:
                why = why_kept(kept, routing.expert, c["experts"], routing.capacity)
            return _fail(r, f"rank {rank}'s kept choices differ from the router's with capacity "
                            f"{routing.capacity}: {why}")
        y, want = o["y"].cpu(), ref["y"][rank]
        if not ex.close(y, want):
            why = describe(y, want)
            gate = ref["routings"][rank].gate
            if c["top_k"] == 1 and y.shape == want.shape and \
                    torch.allclose(y * gate, want, rtol=1e-6, atol=1e-9):
                why = "combine without gate weights: multiply each expert output by its gate"
            return _fail(r, f"output on rank {rank}: {why}")
        g = o["x_grad"]
        if not ex.close(g.cpu() if g is not None else None, ref["x_grad"][rank]):
            return _fail(r, f"x's gradient on rank {rank}: {describe(g, ref['x_grad'][rank])} "
                            f"(each Exchange's backward sends the gradient back with the splits "
                            f"swapped)")
        local = c["experts"] // r.world_size
        mine = slice(rank * local, (rank + 1) * local)
        for n, want_g in ref["expert_grads"].items():
            got_g = o["expert_grads"][n].cpu()
            if not ex.close(got_g, want_g[mine]):
                return _fail(r, f"gradient of {n} of rank {rank}'s experts: "
                                f"{describe(got_g, want_g[mine])}")
    router = sum(o["router_grad"].cpu() for o in r.outputs)
    if not ex.close(router, ref["router_grad"]):
        return _fail(r, f"the router's gradient (summed over the ranks): "
                        f"{describe(router, ref['router_grad'])} (it flows through the gates "
                        f"in combine)")
    return Verdict(True)


def judge_moe(r: CaseResult) -> Verdict:
    """Values and gradients against the single-process layer, then the courier's bytes and
    messages over the WHOLE case (`r.traffic[rank]`, bounded by the courier, which hands out
    the case and takes its output): sends made in expert_capacity or keep, which run before the
    forward section, or moved out of the sections by forged marks, count. The sections (marked
    by the rank) only name the phase in a message, and group the rows `judge_rows` compares."""
    ref = ex.reference(r)
    values = _values(r, ref)
    if not values.passed:
        return values
    want, msgs = ex.wire_bytes(r, ref["routings"]), ex.messages(r, ref["routings"])
    for rank in range(r.world_size):
        case = r.traffic[rank]
        empty = [op for op in case.sends if op.nbytes == 0]
        if empty:
            return _fail(r, f"rank {rank} sent {len(empty)} empty message(s): leave empty "
                            f"pieces out")
        total = want[rank]["forward_wire"] + want[rank]["backward_wire"]
        if case.bytes_sent == total and case.messages_sent == msgs[rank]:
            continue
        for phase in ("forward", "backward"):
            rec, w = case.section(phase), want[rank][f"{phase}_wire"]
            if rec.bytes_sent != w:
                rows = (want[rank]["send_off"] + want[rank]["recv_off"]) * r.case["d"] * 8
                counts = "" if phase == "backward" else \
                    f" the counts ({w - rows} bytes: E/p int64 per other rank) and"
                return _fail(r, f"rank {rank} sent {rec.bytes_sent} bytes in {phase}, expected "
                                f"{w}:{counts} {rows} bytes of rows for other ranks (float64, "
                                f"this rank's own piece copied, not sent)")
        inside = case.section("forward").bytes_sent + case.section("backward").bytes_sent
        return _fail(r, f"rank {rank} sent {case.messages_sent} message(s) of {case.bytes_sent} "
                        f"bytes in the case, expected {msgs[rank]} of {total}"
                        + (f"; {case.bytes_sent - inside} bytes outside dispatch and combine "
                           f"(expert_capacity and keep, for ones, must not communicate)"
                           if case.bytes_sent != inside else
                           ": one message per non-empty piece (counts, then rows)"))
    return judge_rows(r, ref)


WHAT_ROWS = {"forward": "its tokens' rows for that rank's experts (dispatch) and its experts' "
                        "outputs for that rank's tokens (combine)",
             "backward": "the gradients of that rank's experts' outputs, gate·dy (combine's "
                         "backward), and of the rows that rank sent it (dispatch's backward)"}


def judge_rows(r: CaseResult, ref: dict) -> Verdict:
    """Every float64 message's rows, as the courier kept them, per (phase, sender, receiver):
    the multiset `expected.rows_between` gives. Rows of the right size that carry something
    else (zeros, while the rank computes the result some other way) fail."""
    want, d = ex.rows_between(r, ref), r.case["d"]
    for rank in range(r.world_size):
        for phase in ("forward", "backward"):
            got: dict[int, list[torch.Tensor]] = {}
            for op in r.traffic[rank].section(phase).sends:
                if op.data is None:
                    return _fail(r, f"rank {rank}'s message to rank {op.peer} in {phase} could "
                                    f"not be checked: the ranks had sent more than the courier "
                                    f"keeps per launch ({KEEP_BYTES >> 20} MiB) before it")
                if op.dtype == "float64":
                    got.setdefault(op.peer, []).append(
                        make_tensor(op.dtype, list(op.shape), op.data).reshape(-1, d))
            for peer in (j for j in range(r.world_size) if j != rank):
                rows = torch.cat(got.get(peer, []) or [torch.zeros(0, d, dtype=torch.float64)])
                if not ex.same_rows(rows, want[(phase, rank, peer)]):
                    return _fail(r, f"rank {rank}'s float64 messages to rank {peer} in {phase} "
                                    f"do not carry {WHAT_ROWS[phase]} ({len(rows)} rows sent, "
                                    f"{len(want[(phase, rank, peer)])} expected, compared in "
                                    f"any order): every row must travel, computed where its "
                                    f"expert lives")
    return Verdict(True)


MOE = {"d": 6, "f": 8, "top_k": 1, "capacity_factor": 1.0}

CHECKS = [
    Check("expert_capacity: ⌈cf·k·T/E⌉, None for no limit", 6, "capacity",
          (case("capacity", 1, 0, table=[[10, 4, 1, 1.0], [12, 4, 2, 1.0], [16, 4, 1, 1.25],
                                         [7, 4, 2, 1.5], [5, 8, 1, 2.0], [9, 3, 1, None]]),),
          judge_capacity, about="Against toolkit.cost.experts.expert_capacity."),
    # Each first case is laid out (harness.py, layouts.py) so that a wrong drop order and an
    # unswapped backward fail whatever the secret; the second is the router's own draw.
    Check("keep: GShard's order, dropped choices exactly", 8, "keep",
          (case("keep", 1, 0, tokens=12, experts=4, top_k=2, capacity=4, layout="order"),
           case("keep", 1, 2, tokens=12, experts=4, top_k=2, capacity=4, hot=4.0)),
          judge_keep, about="Every first choice before any second choice (GShard Algorithm 1)."),
    Check("dispatch/combine: outputs, gradients and bytes on 2 ranks (top-1)", 14, "moe",
          (case("moe", 2, 0, experts=4, tokens=[9, 6], layout="uneven", **MOE),
           case("moe", 2, 3, experts=4, tokens=[9, 6], **MOE)),
          judge_moe, timeout=60,
          about="Against the single-process MoELayer; bytes from the courier vs step_bytes."),
    Check("dispatch/combine: 4 ranks, top-2, dropped choices", 12, "moe",
          (case("moe", 4, 1, experts=4, tokens=[8, 5, 7, 6],
                **{**MOE, "top_k": 2, "capacity_factor": 1.0}),),
          judge_moe, timeout=60,
          about="Uneven splits; one expert per rank."),
]
