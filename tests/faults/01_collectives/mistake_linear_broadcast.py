"""Mistake: the root sends to every rank itself (a linear broadcast). Expected: values
checks pass, the tree traffic check fails (wrong_result, "linear broadcast").
"""

def tree_broadcast(tensor: torch.Tensor, src: int) -> torch.Tensor:
    """Copy rank `src`'s `tensor` into every rank's `tensor` (in place) along a binomial tree:
    in round k every rank that has the data sends it 2^k ranks further, so it takes ⌈log₂ p⌉
    rounds and no rank sends more than ⌈log₂ p⌉ messages."""
    rank, p = dist.get_rank(), dist.get_world_size()
    if rank == src:
        for peer in range(p):
            if peer != src:
                dist.send(tensor, peer)
    else:
        dist.recv(tensor, src)
    return tensor
