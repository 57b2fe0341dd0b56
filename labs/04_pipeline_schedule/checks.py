"""Lab 04's visible checks and the judges the hidden ones reuse.

The student's schedules come back as plain lists; everything else happens here, in the grader:
`toolkit.pipeline.problems` names what is wrong (missing ops, a backward before its forward,
neighbours that send and receive in different orders, a deadlock, too many micro-batches in
flight), `simulate` measures the bubble against (p−1)/(m+p−1) (GPipe, Huang et al. 2019; 1F1B,
Narayanan et al. 2021), and `run_pipeline` runs the schedule on p real gloo ranks so its
gradients can be compared with the unsplit model's.

The zero-bubble part (ZB-H1, Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, section
2.1) has W ops (weight gradient) beside F and B (input gradient): its bubble
(p−1)(t_F + t_B − t_W) per stage (section 2.3, Table 2) and its memory (no more than 1F1B's).
"""

from __future__ import annotations

import itertools

import torch

from autograder.lab import CaseResult, Check, LabInfo, Verdict
from autograder.outputs import Either, Seq
from toolkit import pipeline
from toolkit.models import TinyMLP, make_regression_data

LAB = LabInfo(
    slug="04_pipeline_schedule",
    title="Lab 04: pipeline schedules",
    student_files=("schedules.py",),
    names=("gpipe", "one_f_one_b", "zb_h1", "bubble_fraction"),
    forbidden_imports=("toolkit.pipeline",),
    devices=("cpu",),  # its ranks return plain lists; the real pipeline runs in the grader
)


def _schedule_form(case: dict, inputs, rank: int, world_size: int) -> Either:
    # The harness turns whatever the student's function returns into text: rows of op names,
    # or a row's (or the whole result's) repr.
    return Either(Seq(Either(Seq(str), str)), str)


# What each call's harness returns (`autograder.outputs`), checked before any judge reads it.
OUTPUTS = {"schedule": _schedule_form, "bubble": lambda case, inputs, rank, p: float}

BACKWARD_OVER_FORWARD = 2.0  # a backward costs about two forwards (two matmuls per one)


def cases(fn: str, pms, seed: int = 0) -> tuple[dict, ...]:
    return tuple({"world_size": 1, "fn": fn, "p": p, "m": m, "seed": seed + k}
                 for k, (p, m) in enumerate(pms))


def grid(ps, ms):
    return list(itertools.product(ps, ms))


def _schedule(r: CaseResult) -> tuple[pipeline.Schedule | None, str]:
    """The student's output as a Schedule checked by the validator, or (None, why not)."""
    out, p, m = r.outputs[0], r.case["p"], r.case["m"]
    where = f"(p = {p}, m = {m})"
    if not isinstance(out, list) or not all(isinstance(row, list) for row in out):
        return None, (f"{r.case['fn']}({p}, {m}) must return a list of lists of op strings, "
                      f"got {str(out)[:80]} {where}")
    try:
        found = pipeline.problems(out, p=p, m=m, v=1)
    except ValueError as err:
        return None, f"{err} {where}"
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        return None, f"[{found[0].kind}] {found[0].message}{more} {where}"
    return pipeline.as_schedule(out, m=m, v=1), ""


def judge_valid(r: CaseResult) -> Verdict:
    schedule, why = _schedule(r)
    return Verdict(schedule is not None, why)


def judge_gpipe(r: CaseResult) -> Verdict:
    schedule, why = _schedule(r)
    if schedule is None:
        return Verdict(False, why)
    for stage, ops in enumerate(schedule.stages):
        kinds = "".join(op.kind for op in ops)
        if "BF" in kinds:
            return Verdict(False, f"stage {stage} runs a forward after a backward: GPipe runs "
                                  f"every forward first (p = {schedule.p}, m = {schedule.m})")
    return Verdict(True)


def judge_in_flight(r: CaseResult) -> Verdict:
    """1F1B's point: stage r holds at most min(p − r, m) micro-batches' activations."""
    schedule, why = _schedule(r)
    if schedule is None:
        return Verdict(False, why)
    p, m = schedule.p, schedule.m
    for stage, held in enumerate(pipeline.in_flight(schedule)):
        if held > min(p - stage, m):
            return Verdict(False, f"stage {stage} holds {held} micro-batches' activations at once; "
                                  f"1F1B holds at most min(p − r, m) = {min(p - stage, m)} "
                                  f"(p = {p}, m = {m}): start backwards earlier")
    return Verdict(True)


def judge_bubble_simulated(r: CaseResult) -> Verdict:
    schedule, why = _schedule(r)
    if schedule is None:
        return Verdict(False, why)
    p, m = schedule.p, schedule.m
    got = pipeline.simulate(schedule, forward=1.0, backward=BACKWARD_OVER_FORWARD).bubble
    want = pipeline.bubble_fraction("1f1b", p=p, m=m)
    if not got <= want + 1e-9:  # written so that a NaN fails too
        return Verdict(False, f"simulated with backward = 2 × forward, stages are idle "
                              f"{got:.1%} of the step; 1F1B's bubble is (p−1)/(m+p−1) = "
                              f"{want:.1%} (p = {p}, m = {m}): some stage waits longer than "
                              "it must")
    return Verdict(True)


def judge_bubble_formula(r: CaseResult) -> Verdict:
    got, p, m = r.outputs[0], r.case["p"], r.case["m"]
    want = pipeline.bubble_fraction("1f1b", p=p, m=m)
    # `not ... <=`: NaN compares False with everything, so `abs(got - want) > tol` passed it
    # (red team 8); the form refuses NaN before this judge runs as well (autograder.outputs).
    if not isinstance(got, float) or not abs(got - want) <= 1e-9:
        if isinstance(got, float) and p > 1 and abs(got - (p - 1) / m) <= 1e-9:
            return Verdict(False, f"bubble_fraction({p}, {m}) returned (p−1)/m = {got:.4g}: "
                                  "that is the idle time as a ratio to the ideal compute time "
                                  "(m slots of work). The fraction asked for is idle time over "
                                  f"the whole step, m + p − 1 slots: (p−1)/(m+p−1) = {want:.4g}")
        return Verdict(False, f"bubble_fraction({p}, {m}) returned {got!r}; check it against a "
                              f"drawing of the schedule (p stages, m micro-batches)")
    return Verdict(True)


def judge_real_ranks(r: CaseResult) -> Verdict:
    """Run the student's schedule on p gloo ranks; gradients must equal the unsplit model's."""
    schedule, why = _schedule(r)
    if schedule is None:
        return Verdict(False, why)
    model = TinyMLP(d_in=8, d_hidden=16, d_out=4, depth=3, seed=r.case["seed"])
    x, y = make_regression_data(4 * max(schedule.m, 2), 8, 4, seed=r.case["seed"])
    try:
        run = pipeline.run_pipeline(model.layers, x, y, schedule=schedule, timeout=60)
    except Exception as err:  # a hang or a crash of the toolkit's executor on this schedule
        return Verdict(False, f"running the schedule on {schedule.p} ranks failed: "
                              f"{type(err).__name__}: {str(err).splitlines()[0]}")
    torch.nn.functional.mse_loss(model.layers(x), y).backward()
    for name, param in model.layers.named_parameters():
        got = run.grads.get(name)
        if got is None or not torch.allclose(got, param.grad, rtol=1e-4, atol=1e-6):
            return Verdict(False, f"on {schedule.p} real ranks with m = {schedule.m}, the gradient "
                                  f"of layer parameter {name} differs from the unsplit model's")
    return Verdict(True)


# --- the zero-bubble part: ZB-H1 (Qi et al., ICLR 2024) -----------------------------------------

def zb_cases(pms, times=(1.0, 1.0, 1.0), seed: int = 0) -> tuple[dict, ...]:
    """ZB-H1 cases: (p, m) and the op times (t_F, t_B, t_W) the simulator uses."""
    f, b, w = times
    return tuple({**case, "forward": f, "backward": b, "weight": w}
                 for case in cases("zb_h1", pms, seed))


def _zb_schedule(r: CaseResult) -> tuple[pipeline.Schedule | None, str]:
    """A valid schedule whose backward is split: every B has its W."""
    split, why = _schedule(r)
    if split is not None and not split.split:
        p, m = split.p, split.m
        return None, (f"zb_h1({p}, {m}) has no W op: ZB-H1 splits each backward into B (input "
                      f"gradient, \"B3\") and W (weight gradient, \"W3\"), and every stage "
                      f"runs both for every micro-batch (p = {p}, m = {m})")
    return split, why


def judge_zb_valid(r: CaseResult) -> Verdict:
    schedule, why = _zb_schedule(r)
    return Verdict(schedule is not None, why)


def judge_zb_memory(r: CaseResult) -> Verdict:
    """ZB-H1's promise (section 2.1): no more activations than 1F1B. Stage r holds at most
    min(p − r, m) micro-batches between their F and their B (1F1B's bound) and at most
    min(p, m) between their F and their W (1F1B's peak, on stage 0)."""
    schedule, why = _zb_schedule(r)
    if schedule is None:
        return Verdict(False, why)
    p, m = schedule.p, schedule.m
    whole = pipeline.peak_held(schedule, weight_share=0.0)    # between F and B
    held = pipeline.in_flight(schedule)                       # between F and W
    for stage, ops in enumerate(schedule.stages):
        last_b = max(i for i, op in enumerate(ops) if op.kind == "B")
        bunched = all(i > last_b for i, op in enumerate(ops) if op.kind == "W")
        if whole[stage] > min(p - stage, m):
            return Verdict(False, f"stage {stage} holds {int(whole[stage])} micro-batches between "
                                  f"their F and their B; 1F1B (and ZB-H1) hold at most "
                                  f"min(p − r, m) = {min(p - stage, m)} (p = {p}, m = {m}): start "
                                  "the B ops earlier")
        if held[stage] > min(p, m):
            why = (" Every W is put off until after the stage's last B: the stage keeps every "
                   "micro-batch's W inputs until then, more than 1F1B ever holds; ZB-H1 runs "
                   "each W soon after its B (stage r: the W of micro-batch j right after the B "
                   "of micro-batch j + r)." if bunched else " Run the W ops sooner.")
            return Verdict(False, f"stage {stage} holds {held[stage]} micro-batches between their "
                                  f"F and their W at once; ZB-H1 holds no more than 1F1B's peak, "
                                  f"min(p, m) = {min(p, m)} (p = {p}, m = {m}).{why}")
    return Verdict(True)


def judge_zb_bubble(r: CaseResult) -> Verdict:
    """Simulated with the case's op times, the idle time is ZB-H1's (p−1)(t_F + t_B − t_W) per
    stage (Qi et al., section 2.3, Table 2; m >= p, t_W <= t_F)."""
    schedule, why = _zb_schedule(r)
    if schedule is None:
        return Verdict(False, why)
    p, m = schedule.p, schedule.m
    times = {k: r.case[k] for k in ("forward", "backward", "weight")}
    got = pipeline.simulate(schedule, **times).bubble
    want = pipeline.bubble_fraction("zb-h1", p=p, m=m, **times)
    if not got <= want + 1e-9:  # written so that a NaN fails too
        f, b, w = times.values()
        # A split backward whose W fill no gap: idle (p−1)(t_F + t_B) per stage.
        unfilled = (p - 1) * (f + b) / (m * (f + b + w) + (p - 1) * (f + b))
        like = (" That is (p−1)(t_F + t_B) per stage: B and W are split but the W ops fill none "
                "of the drain (ZB-H1: on stage r, the W of micro-batch j right after the B of "
                "j + r, the last r W ops after the last B)." if abs(got - unfilled) <= 1e-9
                else "")
        return Verdict(False, f"simulated with t_F = {f:g}, t_B = {b:g}, t_W = {w:g}, stages are "
                              f"idle {got:.1%} of the step; ZB-H1's bubble is (p−1)(t_F + t_B − "
                              f"t_W) per stage, {want:.1%} of the step (p = {p}, m = {m}).{like}")
    return Verdict(True)


def judge_zb_real_ranks(r: CaseResult) -> Verdict:
    """The split schedule on p gloo ranks: B and W ops give the unsplit model's gradients."""
    schedule, why = _zb_schedule(r)
    return judge_real_ranks(r) if schedule is not None else Verdict(False, why)


CHECKS = [
    Check("gpipe: a valid schedule, every forward before any backward", 6, "schedule",
          cases("gpipe", [(1, 1), (2, 1), (2, 4), (4, 4), (4, 8)]), judge_gpipe,
          about="Checked by toolkit.pipeline's validator: all ops there, in order, no deadlock."),
    Check("one_f_one_b: a valid schedule (no missing op, order mismatch or deadlock)", 6,
          "schedule", cases("one_f_one_b", grid((2, 4), (1, 4, 8))), judge_valid),
    Check("one_f_one_b: stage r holds at most min(p − r, m) micro-batches", 4, "schedule",
          cases("one_f_one_b", [(4, 8), (2, 6)]), judge_in_flight),
    Check("one_f_one_b: idle no longer than (p−1)/(m+p−1) of the step (simulated)", 4,
          "schedule", cases("one_f_one_b", [(2, 4), (4, 8)], seed=5), judge_bubble_simulated,
          about="Simulated with a backward twice as long as a forward and free messages."),
    Check("bubble_fraction: (idle time) / (step time)", 4, "bubble",
          cases("bubble", [(2, 1), (4, 4), (4, 8), (8, 32)]), judge_bubble_formula),
    Check("one_f_one_b on real ranks: gradients equal the unsplit model's", 6, "schedule",
          cases("one_f_one_b", [(2, 4), (4, 4)], seed=10), judge_real_ranks, timeout=30,
          about="The toolkit's executor runs your schedule on p gloo ranks."),
    Check("zb_h1: a valid split schedule (every F, B and W; W after its B; no deadlock)", 3,
          "schedule", zb_cases([(2, 4), (3, 3), (4, 8)], seed=20), judge_zb_valid),
    Check("zb_h1: no more activations than 1F1B (min(p − r, m) before B, min(p, m) before W)", 2,
          "schedule", zb_cases([(4, 8), (3, 6)], seed=25), judge_zb_memory),
    Check("zb_h1: idle (p−1)(t_F + t_B − t_W) per stage, the paper's ZB-H1 bubble (simulated)",
          3, "schedule", zb_cases([(2, 4), (4, 8)], seed=30), judge_zb_bubble,
          about="Simulated with t_F = t_B = t_W = 1 and free messages (Qi et al. 2024, Table 2)."),
    Check("zb_h1 on real ranks: B and W give the unsplit model's gradients", 2, "schedule",
          zb_cases([(3, 4)], seed=35), judge_zb_real_ranks, timeout=30,
          about="The toolkit's executor runs B (input gradient) and W (weight gradient) apart."),
]
