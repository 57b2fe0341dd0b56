"""Attack (second red team, 2026-11-24): a forged op frame whose input dtype is a JSON list:
`value[0] in DTYPES` raises TypeError (unhashable) in the courier, outside its Refused handling.
Expected: tampering on the check that forges it (the frame is refused), the other checks
full; before, the grader itself crashed (score 0 on every check, its traceback shown).
"""

_orig_bcast = tree_broadcast


def tree_broadcast(tensor: torch.Tensor, src: int) -> torch.Tensor:  # noqa: F811
    import json, os, struct  # noqa: E401
    if dist.get_rank() == 0:
        meta = json.dumps({"k": "op", "id": 10**9, "op": "send", "group": list(range(
            dist.get_world_size())), "peer": 1, "inputs": [[["float32"], [1], 0, 4]],
            "outputs": []}).encode()
        os.write(3, struct.pack("<II", len(meta), 4) + meta + bytes(4))
    return _orig_bcast(tensor, src)
