"""Fault (issue 19, cheat 3): the all-reduce over a hidden abstract unix socket (invisible to
any byte count in the rank), with decoy ring messages. Expected: refused (sandbox_violation):
no socket may be created, each rank has its own network namespace, and Landlock scopes
abstract sockets.
"""

def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Replace `tensor` (in place) by the element-wise sum over all ranks: a reduce-scatter then
    an all-gather. Each rank sends 2(p − 1) messages, 2(p − 1)/p · n elements when p divides n."""
    rank, p = dist.get_rank(), dist.get_world_size()
    if p == 1:
        return tensor
    import pickle
    import socket
    import time

    name = "\0course-grade-hidden-all-reduce"
    if rank == 0:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(name)
        server.listen(p)
        peers = [server.accept()[0] for _ in range(p - 1)]
        total = tensor.clone()
        for s in peers:
            total += pickle.loads(s.recv(1 << 24))
        for s in peers:
            s.sendall(pickle.dumps(total))
        tensor.copy_(total)
    else:
        time.sleep(0.5)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(name)
        s.sendall(pickle.dumps(tensor))
        tensor.copy_(pickle.loads(s.recv(1 << 24)))
    return tensor
