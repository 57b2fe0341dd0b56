"""Lab 01: collectives from point-to-point messages.

Implement the four functions below with `dist.send` / `dist.recv` / `dist.isend` /
`dist.irecv` only (the `exchange` helper is given). torch's built-in collectives
(`dist.all_reduce`, `dist.broadcast`, ...) and `toolkit.collectives` are off limits: the grader
detects both. Every function works on the default process group, for any world size p ≥ 1,
any number of elements n (also n not divisible by p, and n < p), and float dtypes.

Run `autograder grade .` in this folder to check your work; README.md explains each check.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def chunk_bounds(numel: int, world_size: int) -> list[tuple[int, int]]:
    """(start, end) of chunk i for i in 0..p-1: the first numel % p chunks are one longer.
    Every function below cuts tensors this way (the grader does too)."""
    base, extra = divmod(numel, world_size)
    bounds, start = [], 0
    for r in range(world_size):
        end = start + base + (r < extra)
        bounds.append((start, end))
        start = end
    return bounds


def exchange(send_buf: torch.Tensor, dst: int, recv_buf: torch.Tensor, src: int) -> None:
    """Send `send_buf` to rank `dst` while receiving into `recv_buf` from rank `src`.

    Both are posted before either is waited for, so a ring of ranks that all call this at the
    same time cannot deadlock (lesson 02, section 8). Empty buffers are skipped: neighbours in
    a ring always agree on a chunk's size, so both sides skip together.
    """
    works = []
    if send_buf.numel():
        works.append(dist.isend(send_buf.contiguous(), dst))
    if recv_buf.numel():
        works.append(dist.irecv(recv_buf, src))
    for work in works:
        work.wait()


def ring_reduce_scatter(output: torch.Tensor, input: torch.Tensor) -> torch.Tensor:
    """Write chunk `rank` (chunk_bounds) of the element-wise sum of every rank's `input` into
    `output`. Ring: p − 1 steps; at each, send one chunk to rank + 1 and add the chunk received
    from rank − 1. `input` is left unchanged. Each rank sends about (p − 1)/p · n elements in
    p − 1 messages."""
    rank, p = dist.get_rank(), dist.get_world_size()
    bounds = chunk_bounds(input.numel(), p)
    ### BEGIN SOLUTION
    work = input.reshape(-1).clone()  # partial sums; the input stays as it was
    right, left = (rank + 1) % p, (rank - 1) % p
    for step in range(p - 1):
        # Send the chunk the right neighbour adds to next; receive the one we add to next.
        sent, got = (rank - step - 1) % p, (rank - step - 2) % p
        a, b = bounds[got]
        inbox = input.new_empty(b - a)
        exchange(work[slice(*bounds[sent])], right, inbox, left)
        work[a:b] += inbox
    a, b = bounds[rank]  # after p − 1 additions, our own chunk holds every rank's share
    output.copy_(work[a:b])
    ### END SOLUTION
    ### HINT: copy your rank's slice of `input` into a working buffer, then do p − 1 ring steps
    ### HINT: with `exchange`, adding what you receive; at the end chunk `rank` is complete.
    return output


def ring_all_gather(output: torch.Tensor, input: torch.Tensor) -> torch.Tensor:
    """Fill `output` (n elements) with every rank's `input`, rank i's at chunk_bounds(n, p)[i].
    Ring: p − 1 steps, each passing the chunk received last to rank + 1."""
    rank, p = dist.get_rank(), dist.get_world_size()
    bounds = chunk_bounds(output.numel(), p)
    ### BEGIN SOLUTION
    out = output.view(-1)
    out[slice(*bounds[rank])] = input.reshape(-1)
    right, left = (rank + 1) % p, (rank - 1) % p
    for step in range(p - 1):
        sent, got = (rank - step) % p, (rank - step - 1) % p
        exchange(out[slice(*bounds[sent])], right, out[slice(*bounds[got])], left)
    ### END SOLUTION
    ### HINT: put your own chunk in place, then p − 1 times send the chunk you got last
    ### HINT: to the right while receiving the next one from the left (use `exchange`).
    return output


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
