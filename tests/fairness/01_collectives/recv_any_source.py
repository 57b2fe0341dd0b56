"""Fair: `exchange` receives with `dist.recv(buf)`, without `src` (a receive from any rank: in
a ring only the left neighbour sends to this rank), and checks the sender torch returns (red
team 3, probe07/recv_any: torch asked the work for `_source_rank()` and the grader's backend
crashed with "sourceRank() may only be called ...").
"""
# ruff: noqa: F811, F821 - appended to collectives.py (defines torch, dist, ...)


def exchange(send_buf: torch.Tensor, dst: int, recv_buf: torch.Tensor, src: int) -> None:
    work = dist.isend(send_buf.contiguous(), dst) if send_buf.numel() else None
    if recv_buf.numel():
        sender = dist.recv(recv_buf)  # from any rank; torch returns who sent it
        if sender != src:
            raise RuntimeError(f"received from rank {sender}, expected rank {src}")
    if work is not None:
        work.wait()
