"""Fault: a linear broadcast that edits the recorder's counts to look like a tree. Expected:
tampering, and no points for the tree check.
"""

from toolkit.comm.events import Trace


_totals = Trace.totals


def _fewer_sends(self, *args, **kwargs):
    out = _totals(self, *args, **kwargs)
    for t in out.values():
        t.messages_sent = min(t.messages_sent, 1)
    return out


Trace.totals = _fewer_sends


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
