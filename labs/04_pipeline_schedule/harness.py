"""Lab 04's rank-side calls: the schedule functions are pure, so each case calls one on a single
rank and returns its plain lists (or float). Judging, the validator and the real pipeline run
happen in the grader (`checks.py`), never in the student's process. Holds no answers."""

from __future__ import annotations


def make_inputs(case: dict, world_size: int) -> list:
    return [(case["p"], case["m"])] * world_size


def _schedule(student, call):
    out = getattr(student, call.case["fn"])(call.case["p"], call.case["m"])
    # Plain data only: anything else is reported, not trusted.
    if isinstance(out, (list, tuple)):
        return [[str(op) for op in row] if isinstance(row, (list, tuple)) else repr(row)
                for row in out]
    return repr(out)


def _bubble(student, call):
    return float(student.bubble_fraction(call.case["p"], call.case["m"]))


CALLS = {"schedule": _schedule, "bubble": _bubble}
