"""The ring, pipelined: each chunk cut into slices so that receiving slice k+1 overlaps adding k.

The simple ring (`toolkit.collectives.ring`, Patarasuk & Yuan 2009) does at every step: receive a
whole chunk (n/p bytes), then add it, then send it on. While a rank adds, its link is idle, and
while it receives, its adder is. NCCL and gloo cut every chunk into slices (gloo's `allreduce.cc`
"segments": at least 2 per chunk, at most 1 MiB each, two in flight) and run the ring as a
pipeline over slices:

* a rank forwards slice k of step s as soon as *that slice* of step s−1 has arrived and been
  added, not when the whole chunk has, so the next rank starts on it while slice k+1 is still
  on the wire;
* receives are posted ahead (`window` at a time), so slice k+1 arrives while slice k is added.

The traffic is the simple ring's exactly: every rank sends 2(p−1)/p · n bytes for an all-reduce,
in 2(p−1)·S messages of about n/(p·S) instead of 2(p−1) of n/p (S slices per chunk, the same on
every rank: `ring_slices`). In the α-β model (t = a·α + b·n·β) slicing only adds messages; what
it buys is outside that model: with an add cost γ per byte, the simple ring exposes the adds,
(p−1)/p·n·γ, while the sliced one hides all but about one slice per step, (p−1)/p·n·γ/S
(`toolkit.cost.slicing` holds that model; lesson 03 measures the speed-up per slice count).

Same conventions as the simple ring (in place, any length through `chunk_sizes`, subgroups,
every dtype, the `agree` header); results equal the simple ring's bit for bit for sum, max and
min, because every element is reduced in the same order.
"""

from __future__ import annotations

import torch
import torch.distributed as dist  # isend / irecv looked up at call time (recorded)

from ..chunks import SLICE_BYTES, ring_slices
from ._common import GroupView, ReduceOpLike, chunk_sizes, combine
from .ring import drive_all_gather, drive_all_reduce, drive_reduce_scatter

WINDOW = 2
"""Receives posted ahead of the one being added (gloo keeps two segments in flight too)."""


def pipelined_ring(g: GroupView, chunks: list[torch.Tensor], op: str | None, *, reduce: bool,
                   gather: bool, slices: int, window: int = WINDOW) -> None:
    """Run the reduce-scatter steps (`reduce`), the all-gather steps (`gather`) or both over
    `chunks` (views of one buffer), in place, as one pipeline of slices.

    Unit v = (phase step s, slice k) in order; the send of unit v needs unit v − S finished (it
    forwards what that unit received), so it is posted right after that unit's add.
    """
    p, r, S = g.size, g.rank, slices
    parts = [list(c.split(chunk_sizes(c.numel(), S))) for c in chunks]  # parts[c][k]: slice k
    steps = []                                     # (chunk sent, chunk received, adds?)
    if reduce:
        steps += [((r - s - 1) % p, (r - s - 2) % p, True) for s in range(p - 1)]
    if gather:
        steps += [((r - s) % p, (r - s - 1) % p, False) for s in range(p - 1)]
    units = len(steps) * S
    last_add = (p - 1) * S - 1 if reduce else -1   # last unit of the reduce-scatter
    add = combine(op) if reduce else None
    biggest = max((t.numel() for c in parts for t in c), default=0)
    ref = chunks[0]
    scratch = [torch.empty(biggest, dtype=ref.dtype, device=ref.device)
               for _ in range(min(window, units))] if reduce else []
    right, left = g.peer(r + 1), g.peer(r - 1)

    def target(v: int) -> torch.Tensor:
        out_c, in_c, adds = steps[v // S]
        piece = parts[in_c][v % S]
        return scratch[v % window][: piece.numel()] if adds else piece

    # Looked up at call time (not bound at import) so that toolkit.comm records every message.
    sends, recvs, next_send = [], {}, 0
    ahead = min(S, window)  # sends posted ahead; ≤ S, so each forwards a unit already finished

    def post_sends(done: int) -> None:
        nonlocal next_send
        while next_send < units and next_send <= done + ahead:  # in unit order: FIFO matching
            piece = parts[steps[next_send // S][0]][next_send % S]
            sends.append(dist.isend(piece, right, group=g.handle))
            next_send += 1

    post_sends(-1)
    for v in range(min(window, units)):
        recvs[v] = dist.irecv(target(v), left, group=g.handle)
    for u in range(units):
        recvs.pop(u).wait()
        out_c, in_c, adds = steps[u // S]
        if adds:
            piece = parts[in_c][u % S]
            add(piece, scratch[u % window][: piece.numel()])
            if u > last_add - S and op == "avg":   # this slice of chunk r is now complete
                piece.div_(p)
        post_sends(u)   # first the forward of what just arrived: the neighbour waits for it
        if u + window < units:   # the scratch slot of unit u is free again
            recvs[u + window] = dist.irecv(target(u + window), left, group=g.handle)
    for w in sends:
        w.wait()


def _runner(slice_bytes: int, window: int, *, reduce: bool, gather: bool):
    """The steps for a driver of `ring`: the pipeline with S = `ring_slices` for the group."""
    if window < 1:
        raise ValueError(f"window={window} must be >= 1 (receives posted ahead)")
    ring_slices(0, 1, 1, slice_bytes)  # a bad slice_bytes fails here, before any message

    def run(g: GroupView, chunks: list[torch.Tensor], op: str | None = None) -> None:
        numel = sum(c.numel() for c in chunks)
        S = ring_slices(numel, g.size, chunks[0].element_size(), slice_bytes)
        pipelined_ring(g, chunks, op, reduce=reduce, gather=gather, slices=S, window=window)
    return run


def sliced_ring_all_reduce(tensor: torch.Tensor, group=None, *, op: ReduceOpLike = "sum",
                           check: bool = True, slice_bytes: int = SLICE_BYTES,
                           window: int = WINDOW) -> torch.Tensor:
    """All-reduce `tensor` in place with the pipelined ring; returns it.

    2(p−1)·S messages per rank (S = `ring_slices`), 2(p−1)/p · n bytes, as the simple ring.
    """
    run = _runner(slice_bytes, window, reduce=True, gather=True)
    return drive_all_reduce("sliced_ring_all_reduce", tensor, group, op, check, run)


def sliced_ring_reduce_scatter(output: torch.Tensor, input: torch.Tensor, group=None, *,
                               op: ReduceOpLike = "sum", check: bool = True,
                               slice_bytes: int = SLICE_BYTES, window: int = WINDOW
                               ) -> torch.Tensor:
    """`output` on rank r ← chunk r of the reduction of every rank's `input` (pipelined ring).

    Same contract as `ring_reduce_scatter`: `input` unchanged, `output` holds
    ``chunk_sizes(input.numel(), p)[r]`` elements; (p−1)·S messages per rank.
    """
    run = _runner(slice_bytes, window, reduce=True, gather=False)
    return drive_reduce_scatter("sliced_ring_reduce_scatter", output, input, group, op, check,
                                run)


def sliced_ring_all_gather(output: torch.Tensor, input: torch.Tensor, group=None, *,
                           check: bool = True, slice_bytes: int = SLICE_BYTES,
                           window: int = WINDOW) -> torch.Tensor:
    """`output` (flat layout) ← every rank's `input`, rank r's at chunk r (pipelined ring).

    Same contract as `ring_all_gather`; (p−1)·S messages per rank.
    """
    run = _runner(slice_bytes, window, reduce=False, gather=True)
    return drive_all_gather("sliced_ring_all_gather", output, input, group, check, run)
