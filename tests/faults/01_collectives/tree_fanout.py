"""Attack (second red team, 2026-11-24): a broadcast that is no binomial tree but passes
counts and depth. At p = 4 the root sends once (to v = 1), and v = 1 sends to v = 2 and then
v = 3: depth 2 = ⌈log₂ 4⌉, no rank sends more than twice, yet v = 3 gets the data in round 3.
Expected: the values pass, the tree check fails (wrong_result, "round 3").
"""

def tree_broadcast(tensor: torch.Tensor, src: int) -> torch.Tensor:  # noqa: F811
    rank, p = dist.get_rank(), dist.get_world_size()
    me = (rank - src) % p
    if p == 1:
        return tensor
    if me == 0:
        dist.send(tensor, (1 + src) % p)
    elif me == 1:
        dist.recv(tensor, src)
        for v in range(2, p):
            dist.send(tensor, (v + src) % p)
    else:
        dist.recv(tensor, (1 + src) % p)
    return tensor
