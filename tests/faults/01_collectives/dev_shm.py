"""Fault: leaves 100 MiB in /dev/shm for the next grade to find (it used to outlive the grade).
Expected: refused (sandbox_violation); nothing is written there.
"""

def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Replace `tensor` (in place) by the element-wise sum over all ranks: a reduce-scatter then
    an all-gather. Each rank sends 2(p − 1) messages, 2(p − 1)/p · n elements when p divides n."""
    rank, p = dist.get_rank(), dist.get_world_size()
    if p == 1:
        return tensor
    with open(f"/dev/shm/grade-leftover-{rank}", "wb") as f:
        for _ in range(100):
            f.write(b"x" * 2**20)
    a, b = chunk_bounds(tensor.numel(), p)[rank]
    mine = torch.empty(b - a, dtype=tensor.dtype)
    ring_reduce_scatter(mine, tensor)
    ring_all_gather(tensor, mine)
    return tensor
