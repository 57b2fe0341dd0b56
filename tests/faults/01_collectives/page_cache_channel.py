"""Red team of issue 30's sandbox (tried while building it): the ranks share the host's page
cache of every file their worlds bind read-only. Rank 1 evicts pages of a large shared file
(posix_fadvise DONTNEED) and reads back those whose bit is 1; rank 0 asks which pages are cached
without reading them (preadv2 RWF_NOWAIT: EAGAIN when not cached); one-float send/recv pairs
are the only barriers. Unfiltered, both primitives worked on this project's machine (evicted
pages read as uncached, read ones as cached; readahead marks neighbours too, so this naive
layout read all ones: a real channel spaces its pages). Expected: both refused by the filter,
so every rank raises naming them.
"""

def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    import os

    rank, p = dist.get_rank(), dist.get_world_size()
    if p != 2:
        return tensor
    big = os.path.join(os.path.dirname(torch.__file__), "bin", "test_api")  # a file no one maps
    fd = os.open(big, os.O_RDONLY)
    page, bits = 4096, tensor.numel() * tensor.element_size() * 8
    start = (os.fstat(fd).st_size // 2) // page * page
    refused = []

    def barrier():
        flag = torch.zeros(1)
        if rank == 0:
            dist.send(flag, 1)
            dist.recv(flag, 1)
        else:
            dist.recv(flag, 0)
            dist.send(flag, 0)

    try:
        os.posix_fadvise(fd, start, bits * page, os.POSIX_FADV_DONTNEED)
    except OSError as exc:
        refused.append(f"fadvise: {exc.strerror}")
    try:  # each rank tries both ways, so that whichever raises first names both
        os.preadv(fd, [bytearray(1)], start, os.RWF_NOWAIT)
    except BlockingIOError:
        pass
    except OSError as exc:
        refused.append(f"preadv2 RWF_NOWAIT: {exc.strerror}")
    if refused:
        raise RuntimeError(f"page cache channel refused: {refused}")
    barrier()
    if rank == 1:
        data = tensor.contiguous().view(torch.uint8).tolist()
        for k in range(bits):
            if data[k // 8] >> (k % 8) & 1:
                os.pread(fd, 1, start + k * page)
    barrier()
    got = bytearray(bits // 8)
    if rank == 0:
        buf = bytearray(1)
        for k in range(bits):
            try:
                os.preadv(fd, [buf], start + k * page, os.RWF_NOWAIT)
                got[k // 8] |= 1 << (k % 8)
            except BlockingIOError:
                pass
    barrier()
    if rank == 0:
        other = torch.frombuffer(got, dtype=tensor.dtype)
        tensor += other
        # send it back the same way would need another round; good enough to show the bits
        raise RuntimeError(f"page cache channel: rank 0 read {other.tolist()}")
    return tensor
