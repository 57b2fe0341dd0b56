"""Fault: uses a root capability (chown a file to another user). A grade that runs as root
without a uid of its own must have dropped every capability (else: reboot, mount, raw sockets,
module loading...). Expected: refused (sandbox_violation).
"""

def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Replace `tensor` (in place) by the element-wise sum over all ranks: a reduce-scatter then
    an all-gather. Each rank sends 2(p − 1) messages, 2(p − 1)/p · n elements when p divides n."""
    rank, p = dist.get_rank(), dist.get_world_size()
    if p == 1:
        return tensor
    import os
    mine = os.path.join(os.environ["TMPDIR"], f"owned-{rank}")
    open(mine, "w").close()
    os.chown(mine, 4242, 4242)  # CAP_CHOWN: root's, if the grade kept its capabilities
    return tensor
    a, b = chunk_bounds(tensor.numel(), p)[rank]
    mine = torch.empty(b - a, dtype=tensor.dtype)
    ring_reduce_scatter(mine, tensor)
    ring_all_gather(tensor, mine)
    return tensor
