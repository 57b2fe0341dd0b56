"""Fault: a ring of blocking sends (every rank sends before it receives): on gloo every
rank waits in send for a recv that is never posted. Expected: deadlock.
"""

def exchange(send_buf: torch.Tensor, dst: int, recv_buf: torch.Tensor, src: int) -> None:
    """Send `send_buf` to rank `dst` while receiving into `recv_buf` from rank `src`.

    Both are posted before either is waited for, so a ring of ranks that all call this at the
    same time cannot deadlock (lesson 02, section 8). Empty buffers are skipped: neighbours in
    a ring always agree on a chunk's size, so both sides skip together.
    """
    if send_buf.numel():
        dist.send(send_buf.contiguous(), dst)
    if recv_buf.numel():
        dist.recv(recv_buf, src)
