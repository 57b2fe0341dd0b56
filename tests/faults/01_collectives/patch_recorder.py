"""Fault: a linear broadcast that edits every count a rank could reach (the grader's own classes,
imported in the rank: the courier's records, the traffic totals) to look like a tree. Expected:
no effect on the grade (the courier and its records live in the grader's process): the tree
traffic check fails ("linear broadcast").
"""

try:  # the grader's own modules are not readable in the sandbox; a rank's copy changes nothing
    from autograder.protocol import RankTraffic

    RankTraffic.messages_sent = property(lambda self: min(1, len(self.sends)))
except (ImportError, OSError):
    pass


try:
    from autograder.sandbox import courier as _courier

    _courier.Courier.match = lambda self, *a, **k: None
except (ImportError, OSError):
    pass


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
