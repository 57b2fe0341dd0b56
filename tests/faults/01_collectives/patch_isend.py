"""Fault: replaces torch.distributed's send/recv functions with calls on the process-group
object (the old recorder watched the functions), and broadcasts linearly. Expected: every
message is still counted by the courier, whichever Python function sent it: the tree traffic
check fails ("linear broadcast"), the values pass.
"""

import torch.distributed.distributed_c10d as c10d


def _direct_send(tensor, dst, group=None, tag=0):
    return c10d._get_default_group().send([tensor], dst, tag)


def _direct_recv(tensor, src, group=None, tag=0):
    return c10d._get_default_group().recv([tensor], src, tag)


for _name, _fn in (("isend", _direct_send), ("irecv", _direct_recv)):
    setattr(dist, _name, _fn)
    setattr(c10d, _name, _fn)


def tree_broadcast(tensor: torch.Tensor, src: int) -> torch.Tensor:
    """Copy rank `src`'s `tensor` into every rank's `tensor` (in place) along a binomial tree:
    in round k every rank that has the data sends it 2^k ranks further, so it takes ⌈log₂ p⌉
    rounds and no rank sends more than ⌈log₂ p⌉ messages."""
    rank, p = dist.get_rank(), dist.get_world_size()
    if rank == src:
        for work in [dist.isend(tensor, peer) for peer in range(p) if peer != src]:
            work.wait()
    else:
        dist.irecv(tensor, src).wait()
    return tensor
