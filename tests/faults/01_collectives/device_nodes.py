"""Fault: opens device nodes for writing (as uid 0 they used to be open to a rank). Expected:
refused (sandbox_violation); only /dev/null may be written.
"""

def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Replace `tensor` (in place) by the element-wise sum over all ranks: a reduce-scatter then
    an all-gather. Each rank sends 2(p − 1) messages, 2(p − 1)/p · n elements when p divides n."""
    rank, p = dist.get_rank(), dist.get_world_size()
    if p == 1:
        return tensor
    for path in ("/dev/console", "/dev/tty1", "/dev/loop0", "/dev/kvm"):
        with open(path, "wb") as f:
            f.write(b"\n")
    a, b = chunk_bounds(tensor.numel(), p)[rank]
    mine = torch.empty(b - a, dtype=tensor.dtype)
    ring_reduce_scatter(mine, tensor)
    ring_all_gather(tensor, mine)
    return tensor
