"""Attack (seventh red team, issue 30): results that alias. Rank 0 writes its own output frame:
one 8 MiB payload named by 200 tensor nodes. Each node passed every size check, and decoding
built 200 copies: 1.6 GB of grader memory per forged frame (313 → 1,887 MB measured), an OOM
kill at the limits. Expected: the frame is refused before any tensor is built (two tensors name
the same bytes), tampering on the checks that call it, the other checks full, the grader
bounded.
"""

import _lab_harness  # noqa: E402

_reference_all_reduce = _lab_harness.CALLS["all_reduce"]
_NODE = {"__tensor__": ["float32", [2 << 20], 0, 8 << 20]}  # 2 Mi float32 = 8 MiB


def _aliasing_all_reduce(student, call):
    import json, os, struct, sys  # noqa: E401
    out = _reference_all_reduce(student, call)
    if call.rank == 0:
        frame, index = sys._getframe(), None
        while frame is not None and index is None:
            index = frame.f_locals.get("index") if frame.f_code.co_name == "main" else None
            frame = frame.f_back
        meta = json.dumps({"k": "output", "case": index, "tree": [_NODE] * 200}).encode()
        data = memoryview(struct.pack("<II", len(meta), 8 << 20) + meta + bytes(8 << 20))
        while data:
            data = data[os.write(3, data):]
    return out


_lab_harness.CALLS["all_reduce"] = _aliasing_all_reduce
