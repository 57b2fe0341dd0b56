"""Attack (second red team, 2026-11-24): a forged output frame whose tensor has shape [2**63, 0]
(unpack catches FrameError and RecursionError only; torch raises TypeError).
Expected: tampering on the check that forges it (the frame is refused), the other checks
full; before, the grader itself crashed (score 0 on every check, its traceback shown).
"""

_orig_bcast = tree_broadcast


def tree_broadcast(tensor: torch.Tensor, src: int) -> torch.Tensor:  # noqa: F811
    import json, os, struct, sys  # noqa: E401
    if dist.get_rank() == 0:
        frame, index = sys._getframe(), None
        while frame is not None and index is None:
            index = frame.f_locals.get("index") if frame.f_code.co_name == "main" else None
            frame = frame.f_back
        meta = json.dumps({"k": "output", "case": index,
                           "tree": {"__tensor__": ["float32", [2**63, 0], 0, 0]}}).encode()
        os.write(3, struct.pack("<II", len(meta), 0) + meta)
    return _orig_bcast(tensor, src)
