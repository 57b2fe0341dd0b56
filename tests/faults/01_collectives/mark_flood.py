"""Attack (red team, 2026-11-24): fill the grader's memory with marks. The all-reduce's harness
call (patched at import) sends 150,000 marks of 200 characters per rank before it runs:
uncounted by the call limit, every one was kept until the grade ended (2.6 GB on lab 01's
visible checks). Expected: call_limit for the checks that call it (marks count as calls, at
most MAX_CALLS per launch); the other checks pass; the grader's memory stays bounded.
"""

import _lab_harness  # noqa: E402

_reference_all_reduce = _lab_harness.CALLS["all_reduce"]


def _flooding_all_reduce(student, call):
    for i in range(150_000):
        call.mark(f"{i:0200d}")
    return _reference_all_reduce(student, call)


_lab_harness.CALLS["all_reduce"] = _flooding_all_reduce
