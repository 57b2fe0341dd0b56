"""Attack (red team, 2026-11-24): a chain broadcast, root → root+1 → … → root−1. No rank
sends more than once and every other rank receives once, so counts alone look like a tree.
Expected: the values pass, the binomial-tree check fails (wrong_result): the tensor takes
p − 1 = 3 hops to reach the last rank of 4, a binomial tree ⌈log₂ 4⌉ = 2.
"""

def tree_broadcast(tensor: torch.Tensor, src: int) -> torch.Tensor:
    rank, p = dist.get_rank(), dist.get_world_size()
    me = (rank - src) % p
    if me > 0:
        dist.recv(tensor, (rank - 1) % p)
    if me < p - 1:
        dist.send(tensor, (rank + 1) % p)
    return tensor
