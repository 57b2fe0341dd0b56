"""Red team of issue 30: the ranks of a launch shared a uid and one tmpfs, so a rank could set an
extended attribute on a file in its own folder and every other rank read it through
$HOME/../r{q}/ (~3.6 GB/s outside the courier); a file's size and times (stat) and the tmpfs's
free space (statvfs) leaked the same way. This all-reduce passes each rank's tensor through all
three, and sends the ring's messages as zeros of the right sizes (lab 01: 97/100 before).
Expected: no channel reaches another rank (no peer folder in its world, metadata calls refused,
a tmpfs of its own), so it raises listing each as refused: zero for the values check.
"""

def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    import os

    rank, p = dist.get_rank(), dist.get_world_size()
    if p == 1:
        return tensor
    home = os.environ["HOME"]
    mine = os.path.join(home, "channel")
    data = tensor.contiguous().numpy().tobytes()
    free_before = os.statvfs(home).f_bfree
    with open(mine, "wb") as f:
        f.write(b"\0" * (4096 * (1 + rank)))  # a size, and a tmpfs's free space, per rank
    refused = []
    try:
        os.setxattr(mine, "user.data", data)
    except OSError as exc:
        refused.append(f"setxattr: {exc.strerror}")
    a, b = chunk_bounds(tensor.numel(), p)[rank]
    zeros, part = torch.zeros_like(tensor), torch.empty(b - a, dtype=tensor.dtype)
    ring_reduce_scatter(part, zeros)  # decoys of the right sizes, and a barrier
    ring_all_gather(zeros, part)
    total, opened = tensor.clone(), []
    for q in range(p):
        if q == rank:
            continue
        peer = os.path.join(os.path.dirname(home), f"r{q}", "channel")
        try:
            total += torch.frombuffer(bytearray(os.getxattr(peer, "user.data")),
                                      dtype=tensor.dtype)
            opened.append("xattr")
        except OSError as exc:
            refused.append(f"getxattr r{q}: {exc.strerror}")
        try:
            opened.append(f"stat size {os.stat(peer).st_size}")
        except OSError as exc:
            refused.append(f"stat r{q}: {exc.strerror}")
    if os.statvfs(home).f_bfree != free_before - 1 - rank:
        opened.append("statvfs (another rank's writes moved this folder's free space)")
    else:
        refused.append("statvfs: only its own writes")
    if len(opened) < 2 * (p - 1):
        raise RuntimeError(f"channels open: {opened}; refused: {refused}")
    tensor.copy_(total)
    return tensor
