"""Mistake: a chain reduce to rank 0 (each rank adds and passes on): only rank 0 ends with
the sum. Expected: wrong_result, "only rank 0".
"""

def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Replace `tensor` (in place) by the element-wise sum over all ranks: a reduce-scatter then
    an all-gather. Each rank sends 2(p − 1) messages, 2(p − 1)/p · n elements when p divides n."""
    rank, p = dist.get_rank(), dist.get_world_size()
    if p == 1:
        return tensor
    if rank < p - 1:
        inbox = torch.empty_like(tensor)
        dist.recv(inbox, rank + 1)
        tensor += inbox
    if rank > 0:
        dist.send(tensor, rank - 1)
    return tensor
    a, b = chunk_bounds(tensor.numel(), p)[rank]
    mine = torch.empty(b - a, dtype=tensor.dtype)
    ring_reduce_scatter(mine, tensor)
    ring_all_gather(tensor, mine)
    return tensor
