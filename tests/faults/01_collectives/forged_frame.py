"""Fault: writes frames of its own on the rank's channel (fd 3): an output for the running case
(its number found in the rank's frames) whose tensor has a string shape and a string wchar, and
from the other rank a header announcing 4 GiB. Expected: tampering for this check, never a
grader failure.
"""

def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Replace `tensor` (in place) by the element-wise sum over all ranks: a reduce-scatter then
    an all-gather. Each rank sends 2(p − 1) messages, 2(p − 1)/p · n elements when p divides n."""
    rank, p = dist.get_rank(), dist.get_world_size()
    if p == 1:
        return tensor
    import json
    import os
    import struct
    import sys

    if rank == 0:
        frame, index = sys._getframe(), None
        while frame is not None and index is None:
            index = frame.f_locals.get("index") if frame.f_code.co_name == "main" else None
            frame = frame.f_back
        meta = json.dumps({"k": "output", "case": index, "wchar": "lots",
                           "tree": {"__tensor__": ["float32", "lots", 0, 8]}}).encode()
        os.write(3, struct.pack("<II", len(meta), 8) + meta + bytes(8))
    else:
        os.write(3, struct.pack("<II", 2**32 - 1, 2**32 - 1))
    a, b = chunk_bounds(tensor.numel(), p)[rank]
    mine = torch.empty(b - a, dtype=tensor.dtype)
    ring_reduce_scatter(mine, tensor)
    ring_all_gather(tensor, mine)
    return tensor
