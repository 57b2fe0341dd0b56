"""Fault: 30,000 empty folders in $TMPDIR (folders were not counted against the 10,000-file
limit). Expected: disk_limit for this check only.
"""

def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Replace `tensor` (in place) by the element-wise sum over all ranks: a reduce-scatter then
    an all-gather. Each rank sends 2(p − 1) messages, 2(p − 1)/p · n elements when p divides n."""
    rank, p = dist.get_rank(), dist.get_world_size()
    if p == 1:
        return tensor
    import os
    for k in range(30_000):
        os.mkdir(os.path.join(os.environ["TMPDIR"], f"empty-{k}"))
    a, b = chunk_bounds(tensor.numel(), p)[rank]
    mine = torch.empty(b - a, dtype=tensor.dtype)
    ring_reduce_scatter(mine, tensor)
    ring_all_gather(tensor, mine)
    return tensor
