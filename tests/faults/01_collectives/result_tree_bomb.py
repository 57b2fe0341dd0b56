"""Attack (second red team, 2026-11-24): results that cost no bytes. The all-reduce's harness
call (patched at import) returns its result beside 1,390,000 empty lists: 4 MiB of JSON, under
the frame cap, no payload (RESULT_BYTES counts bytes only), about 100 MiB of Python objects in
the grader per output. Expected: result_limit for the checks that call it (the courier also
caps the values it keeps: RESULT_NODES), the other checks pass, the grader stays bounded.
"""

import _lab_harness  # noqa: E402

_reference_all_reduce = _lab_harness.CALLS["all_reduce"]
_BOMB = [[] for _ in range(1_390_000)]


def _bombing_all_reduce(student, call):
    return [_reference_all_reduce(student, call), _BOMB]


_lab_harness.CALLS["all_reduce"] = _bombing_all_reduce
