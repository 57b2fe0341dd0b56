"""Fault: signals a process outside the sandbox (here a test's `sleep 314.159` sentinel, whose pid
the test writes below: a rank cannot list other processes). Expected: refused (the rank is pid 1
of a pid namespace of its own, where that pid names nothing; Landlock scopes signals to the
sandbox too); the sentinel lives.
"""

SENTINEL_PID = 0  # the test writes the sentinel's pid here


def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Replace `tensor` (in place) by the element-wise sum over all ranks: a reduce-scatter then
    an all-gather. Each rank sends 2(p − 1) messages, 2(p − 1)/p · n elements when p divides n."""
    rank, p = dist.get_rank(), dist.get_world_size()
    if p == 1:
        return tensor
    import os
    import signal
    os.kill(SENTINEL_PID, signal.SIGKILL)
    return tensor
    a, b = chunk_bounds(tensor.numel(), p)[rank]
    mine = torch.empty(b - a, dtype=tensor.dtype)
    ring_reduce_scatter(mine, tensor)
    ring_all_gather(tensor, mine)
    return tensor
