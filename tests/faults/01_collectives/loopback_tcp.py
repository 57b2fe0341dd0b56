"""Fault: reaches a TCP service on the host's loopback (the test runs a listener and writes its
port below). Expected: refused (sandbox_violation), and the listener sees no connection.
"""

LISTENER_PORT = 0  # the test writes the listener's port here


def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Replace `tensor` (in place) by the element-wise sum over all ranks: a reduce-scatter then
    an all-gather. Each rank sends 2(p − 1) messages, 2(p − 1)/p · n elements when p divides n."""
    rank, p = dist.get_rank(), dist.get_world_size()
    if p == 1:
        return tensor
    import socket
    for _ in range(10):
        with socket.create_connection(("127.0.0.1", LISTENER_PORT), timeout=2) as s:
            s.sendall(b"hello from a rank")
    a, b = chunk_bounds(tensor.numel(), p)[rank]
    mine = torch.empty(b - a, dtype=tensor.dtype)
    ring_reduce_scatter(mine, tensor)
    ring_all_gather(tensor, mine)
    return tensor
