"""Attack (red team, 2026-11-24): ring_all_reduce as a star. Every rank ships its chunks to
rank 0, which adds and hands the sum back
the other ranks then relay their own chunk to each
other so every rank sends and receives as many messages and bytes as in a ring. Expected: the
values pass, the ring traffic check at 4 ranks fails (wrong_result): rank 0 talks to every
rank, and a ring rank has two neighbours only.
"""

def ring_all_reduce(tensor):
    """NOT a ring: gather every input on rank 0, add there, hand the sum back out."""
    rank, p = dist.get_rank(), dist.get_world_size()
    if p == 1:
        return tensor
    flat = tensor.view(-1)
    bounds = chunk_bounds(flat.numel(), p)
    if rank == 0:
        total = flat.clone()
        works, bufs = [], []
        for r in range(1, p):
            for j in range(p):
                a, b = bounds[j]
                if b == a:
                    continue
                buf = flat.new_empty(b - a)
                bufs.append((j, buf))
                works.append(dist.irecv(buf, r))
        for w in works:
            w.wait()
        acc = total.double()
        for j, buf in bufs:
            a, b = bounds[j]
            acc[a:b] += buf.double()
        flat.copy_(acc.to(flat.dtype))
        sends = []
        for r in range(1, p):
            for j in (r, 0):
                a, b = bounds[j]
                if b > a:
                    sends.append(dist.isend(flat[a:b].clone(), r))
        for w in sends:
            w.wait()
    else:
        mine = flat.clone()
        works = []
        for j in range(p):
            a, b = bounds[j]
            if b > a:
                works.append(dist.isend(mine[a:b].clone(), 0))
        a, b = bounds[rank]
        if b > a:
            dist.irecv(flat[a:b], 0).wait()
        a0, b0 = bounds[0]
        r0 = dist.irecv(flat[a0:b0], 0) if b0 > a0 else None
        fw = []
        for s in range(1, p):
            if s != rank and b > a:
                fw.append(dist.isend(flat[a:b].clone(), s))
            sa, sb = bounds[s]
            if s != rank and sb > sa:
                fw.append(dist.irecv(flat[sa:sb], s))
        if r0:
            r0.wait()
        for w in works + fw:
            w.wait()
    return tensor
