"""Fair: a textbook ring all-reduce (reduce-scatter then all-gather, one neighbour each way)
that cuts the tensor with torch.chunk (⌈n/p⌉ per piece, the last shorter) instead of
chunk_bounds. Its result is exact; the traffic check accepts the cut (second red team).
"""
# ruff: noqa: F811, F821 - appended to collectives.py (defines torch, dist, exchange, ...)

def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Replace `tensor` (in place) by the element-wise sum over all ranks: a reduce-scatter then
    an all-gather. Each rank sends 2(p − 1) messages, 2(p − 1)/p · n elements when p divides n."""
    rank, p = dist.get_rank(), dist.get_world_size()
    if p == 1:
        return tensor
    ### BEGIN SOLUTION
    a, b = chunk_bounds(tensor.numel(), p)[rank]
    mine = tensor.new_empty(b - a)
    ring_reduce_scatter(mine, tensor)
    ring_all_gather(tensor, mine)
    ### END SOLUTION
    ### HINT: two functions above do all the work; mind which tensor is the input.
    return tensor


def tree_broadcast(tensor: torch.Tensor, src: int) -> torch.Tensor:
    """Copy rank `src`'s `tensor` into every rank's `tensor` (in place) along a binomial tree,
    largest offset first: with ranks numbered v = (rank − src) mod p and D = 2^(⌈log₂ p⌉ − 1),
    in round k = 1, 2, … every rank that has the data sends it D/2^(k−1) positions further
    when that position is below p (half the tree's span first, …, 1 last: at p = 8 the root
    sends to v = 4, then 2, then 1), so it takes ⌈log₂ p⌉ rounds and no rank sends more than
    ⌈log₂ p⌉ messages."""
    rank, p = dist.get_rank(), dist.get_world_size()
    ### BEGIN SOLUTION
    me = (rank - src) % p  # position in the tree, the root at 0
    mask = 1
    while mask < p:  # receive once, from the rank that differs in our lowest set bit
        if me & mask:
            dist.recv(tensor, (me - mask + src) % p)
            break
        mask <<= 1
    mask >>= 1
    while mask:  # then forward to every rank below us in the tree
        if me + mask < p:
            dist.send(tensor, (me + mask + src) % p)
        mask >>= 1
    ### END SOLUTION
    ### HINT: number ranks relative to src; rank v receives from v minus its lowest set bit,
    ### HINT: then sends to v + 2^j for each smaller power of two that stays below p.
    return tensor


# FAIRNESS: a correct ring all-reduce (reduce-scatter then all-gather, 2(p-1) messages, one
# neighbour each way) that cuts the tensor with torch.chunk (ceil(n/p)-sized pieces, last one
# shorter) instead of chunk_bounds. The result is exact; the ring is the textbook one.
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
