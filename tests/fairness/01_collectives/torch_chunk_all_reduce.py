"""Fair: a textbook ring all-reduce (reduce-scatter then all-gather, one neighbour each way)
that cuts the tensor with torch.chunk (⌈n/p⌉ per piece, the last shorter) instead of
chunk_bounds. Its result is exact; the traffic check accepts the cut (second red team).
"""
# ruff: noqa: F811, F821 - appended to collectives.py (defines torch, dist, exchange, ...)

def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    rank, p = dist.get_rank(), dist.get_world_size()
    if p == 1:
        return tensor
    flat = tensor.view(-1)
    chunks = list(flat.chunk(p))
    while len(chunks) < p:  # torch.chunk can return fewer than p pieces
        chunks.append(flat[flat.numel():])
    right, left = (rank + 1) % p, (rank - 1) % p
    for step in range(p - 1):
        s, g = (rank - step - 1) % p, (rank - step - 2) % p
        inbox = torch.empty_like(chunks[g])
        exchange(chunks[s], right, inbox, left)
        chunks[g] += inbox
    for step in range(p - 1):
        s, g = (rank - step) % p, (rank - step - 1) % p
        exchange(chunks[s], right, chunks[g], left)
    return tensor
