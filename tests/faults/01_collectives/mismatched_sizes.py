"""Fault: rank 0 sends one element more than its neighbour receives. Expected: mismatch.
"""

def exchange(send_buf: torch.Tensor, dst: int, recv_buf: torch.Tensor, src: int) -> None:
    """Send `send_buf` to rank `dst` while receiving into `recv_buf` from rank `src`.

    Both are posted before either is waited for, so a ring of ranks that all call this at the
    same time cannot deadlock (lesson 02, section 8). Empty buffers are skipped: neighbours in
    a ring always agree on a chunk's size, so both sides skip together.
    """
    works = []
    if send_buf.numel():
        if dist.get_rank() == 0:
            send_buf = torch.cat([send_buf, send_buf[:1]])
        works.append(dist.isend(send_buf.contiguous(), dst))
    if recv_buf.numel():
        works.append(dist.irecv(recv_buf, src))
    for work in works:
        work.wait()
