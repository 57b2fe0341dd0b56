"""Fault: 1,500 nested folders, then the real work (the grader's recursive walk and removal used
to crash on them). Expected: the check passes, the grade's folder is gone, no grader failure.
"""

def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Replace `tensor` (in place) by the element-wise sum over all ranks: a reduce-scatter then
    an all-gather. Each rank sends 2(p − 1) messages, 2(p − 1)/p · n elements when p divides n."""
    rank, p = dist.get_rank(), dist.get_world_size()
    if p == 1:
        return tensor
    import os
    fd = os.open(os.environ["TMPDIR"], os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(1_500):
        os.mkdir("d" * 100, dir_fd=fd)
        deeper = os.open("d" * 100, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = deeper
    os.close(fd)
    a, b = chunk_bounds(tensor.numel(), p)[rank]
    mine = torch.empty(b - a, dtype=tensor.dtype)
    ring_reduce_scatter(mine, tensor)
    ring_all_gather(tensor, mine)
    return tensor
