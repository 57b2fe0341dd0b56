"""Fault: plants symbolic links (to the hidden checks and to /etc/shadow) and a FIFO, named like
the logs a grader might read, wherever it can write. A grader that followed the link would print
the target; one that opened the FIFO would hang. Expected: refused (sandbox_violation); the
grader opens nothing the ranks wrote, and the report holds no line of the targets.
"""

def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Replace `tensor` (in place) by the element-wise sum over all ranks: a reduce-scatter then
    an all-gather. Each rank sends 2(p − 1) messages, 2(p − 1)/p · n elements when p divides n."""
    rank, p = dist.get_rank(), dist.get_world_size()
    if p == 1:
        return tensor
    import os
    from pathlib import Path

    import toolkit

    hidden = Path(toolkit.__file__).resolve().parents[1] / "labs" / "01_collectives" / "hidden"
    for folder in (os.environ["TMPDIR"], os.path.join(os.environ["TMPDIR"], "..", "logs"),
                   os.getcwd()):
        for k, target in enumerate((hidden / "checks.py", "/etc/shadow")):
            try:
                os.symlink(target, os.path.join(folder, f"c0-p2.rank{k}.log"))
            except FileNotFoundError:
                pass
        try:
            os.mkfifo(os.path.join(folder, "c0-p2.rank2.log"))
        except FileNotFoundError:
            pass
    a, b = chunk_bounds(tensor.numel(), p)[rank]
    mine = torch.empty(b - a, dtype=tensor.dtype)
    ring_reduce_scatter(mine, tensor)
    ring_all_gather(tensor, mine)
    return tensor
