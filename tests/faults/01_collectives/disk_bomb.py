"""Fault: a disk bomb: files of 16 MiB in $TMPDIR without end (each under the per-file
limit). Expected: disk_limit.
"""

def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Replace `tensor` (in place) by the element-wise sum over all ranks: a reduce-scatter then
    an all-gather. Each rank sends 2(p − 1) messages, 2(p − 1)/p · n elements when p divides n."""
    rank, p = dist.get_rank(), dist.get_world_size()
    if p == 1:
        return tensor
    import os
    block = b"x" * 2**20
    for k in range(100_000):  # 16 MiB files, each under the file-size limit, without end
        with open(os.path.join(os.environ["TMPDIR"], f"fill-{rank}-{k}"), "wb") as f:
            for _ in range(16):
                f.write(block)
    return tensor
    a, b = chunk_bounds(tensor.numel(), p)[rank]
    mine = torch.empty(b - a, dtype=tensor.dtype)
    ring_reduce_scatter(mine, tensor)
    ring_all_gather(tensor, mine)
    return tensor
