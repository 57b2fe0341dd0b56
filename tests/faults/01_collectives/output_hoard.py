"""Attack (red team, 2026-11-24): fill the grader's memory with results. The all-reduce's
harness call (patched at import) returns 60 MiB more on every rank: 240 MiB per launch at 4
ranks, which the grader kept for every launch until the last one ended (3.6 GB on lab 01's
visible checks). Expected: result_limit for the checks that call it (the courier keeps at most
RESULT_BYTES of results per launch, and the grader judges and drops each launch as it ends);
the other checks pass; the grader's memory stays bounded.
"""

import _lab_harness  # noqa: E402

_reference_all_reduce = _lab_harness.CALLS["all_reduce"]


def _hoarding_all_reduce(student, call):
    return [_reference_all_reduce(student, call), torch.ones(15 << 20)]  # + 60 MiB of float32


_lab_harness.CALLS["all_reduce"] = _hoarding_all_reduce
