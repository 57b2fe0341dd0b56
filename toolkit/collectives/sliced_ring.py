"""The ring, pipelined: each chunk cut into slices so that receiving slice k+1 overlaps adding k.

The simple ring (`toolkit.collectives.ring`, Patarasuk & Yuan 2009) does at every step: receive a
whole chunk (n/p bytes), then add it, then send it on. While a rank adds, its link is idle, and
while it receives, its adder is. NCCL and gloo cut every chunk into slices (gloo's `allreduce.cc`
"segments": at least 2 per chunk, at most 1 MiB each, two in flight) and run the ring as a
pipeline over slices:

* a rank forwards slice k of step s as soon as *that slice* of step s−1 has arrived and been
  added, not when the whole chunk has, so the next rank starts on it while slice k+1 is still
  on the wire;
* receives are posted ahead, before the sends, so slice k+1 arrives while slice k is added and
  the left neighbour's send finds its receive waiting (gloo then writes it at once; otherwise
  the send waits for a "ready" notice first). Every receive of the call is posted up front while
  the reduce-scatter's scratch fits in `AHEAD_BYTES`, else `WINDOW` or more slices at a time.

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

from ..chunks import SLICE_BYTES, ring_slices
from ._common import GroupView, ReduceOpLike, chunk_sizes, combine
from .ring import drive_all_gather, drive_all_reduce, drive_reduce_scatter

WINDOW = 2
"""Reduce-scatter receives in flight at least (gloo keeps two segments in flight too)."""

AHEAD_BYTES = 8 << 20
"""Scratch (bytes) the reduce-scatter may fill with receives posted ahead: at least `WINDOW`
slices, more while they fit. Below about 8 MiB per rank every receive of the call is posted
before the first send: gloo's transport writes a message at once only to a receiver that has
already posted its receive (``gloo/transport/tcp/pair.cc``: a send otherwise waits for the
receiver's "ready" notice, one more trip through both ranks' transport threads). Posting them
all up front cut the CPU of a 1 MB all-reduce at 4 ranks on 2 cores by about 40 % (20.6 → 11.7
ms per call over all ranks and threads, gloo's own 10.7; nice 19 on a loaded machine)."""

_SCRATCH: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}
"""One reduce-scatter scratch buffer per (device, dtype), kept between calls (at most
`AHEAD_BYTES` each): a fresh one of some MiB is page-faulted in on every call (600 faults
per 16 MB call at 4 ranks), which gloo's own all-reduce does not pay."""


def _take_scratch(numel: int, like: torch.Tensor) -> torch.Tensor:
    """A buffer of at least `numel` elements of `like`'s dtype on its device. Taken out of the
    cache while in use, so a call running at the same time (another thread) makes its own."""
    buf = _SCRATCH.pop((like.device, like.dtype), None)
    if buf is None or buf.numel() < numel:
        buf = torch.empty(numel, dtype=like.dtype, device=like.device)
    return buf


def _give_back(buf: torch.Tensor) -> None:
    if buf.numel() * buf.element_size() <= AHEAD_BYTES:
        _SCRATCH[(buf.device, buf.dtype)] = buf


def pipelined_ring(g: GroupView, chunks: list[torch.Tensor], op: str | None, *, reduce: bool,
                   gather: bool, slices: int, window: int | None = None) -> None:
    """Run the reduce-scatter steps (`reduce`), the all-gather steps (`gather`) or both over
    `chunks` (views of one buffer), in place, as one pipeline of slices.

    Unit v = (phase step s, slice k) in order; the send of unit v needs unit v − S finished (it
    forwards what that unit received), so it is posted right after that unit's add. Receives
    are posted in unit order (the order the left neighbour sends in, which NCCL and gloo both
    match by), ahead of the sends: a reduce-scatter receive needs a free scratch slice (`window`
    of them; None: as many as `AHEAD_BYTES` holds, at least `WINDOW`), an all-gather receive
    lands in place and is posted as soon as every receive before it is.
    """
    p, r, S = g.size, g.rank, slices
    # parts[c][k]: slice k of chunk c. split_with_sizes, not Tensor.split (a Python wrapper):
    # a small call's CPU is its Python (some 45 µs a 4 KB all-reduce, without the messages).
    parts = [[c] if S == 1 else list(c.split_with_sizes(chunk_sizes(c.numel(), S)))
             for c in chunks]
    steps = []                                     # (chunk sent, chunk received, adds?)
    if reduce:
        steps += [((r - s - 1) % p, (r - s - 2) % p, True) for s in range(p - 1)]
    if gather:
        steps += [((r - s) % p, (r - s - 1) % p, False) for s in range(p - 1)]
    units = len(steps) * S
    adding = (p - 1) * S if reduce else 0          # units 0 … adding−1 receive into scratch
    add = combine(op) if reduce else None
    ref = chunks[0]
    biggest = max((t.numel() for c in parts for t in c), default=0)
    depth = window if window is not None else max(
        WINDOW, AHEAD_BYTES // max(1, biggest * ref.element_size()))
    slots = min(depth, adding)                     # scratch slices (0: an all-gather alone)
    buf = _take_scratch(slots * biggest, ref) if slots else None
    scratch = [buf[i * biggest:(i + 1) * biggest] for i in range(slots)]

    def target(v: int) -> torch.Tensor:
        piece = parts[steps[v // S][1]][v % S]
        return scratch[v % slots][: piece.numel()] if v < adding else piece

    # GroupView.isend / irecv: dist.isend / irecv as toolkit.comm records them, minus torch's
    # Python checks (10-19 µs of CPU a message here; the view made them once).
    sends, recvs, next_send, next_recv = [], {}, 0, 0
    ahead = min(S, depth)  # sends posted ahead; ≤ S, so each forwards a unit already finished

    def post_sends(done: int) -> None:
        nonlocal next_send
        while next_send < units and next_send <= done + ahead:  # in unit order: FIFO matching
            piece = parts[steps[next_send // S][0]][next_send % S]
            sends.append(g.isend(piece, r + 1))
            next_send += 1

    def post_recvs(done: int) -> None:
        nonlocal next_recv   # a scratch slot frees when the unit `slots` before is added
        while next_recv < units and (next_recv >= adding or next_recv <= done + slots):
            recvs[next_recv] = g.irecv(target(next_recv), r - 1)
            next_recv += 1

    post_recvs(-1)   # receives first: a send that finds its receive posted goes straight out
    post_sends(-1)
    for u in range(units):
        recvs.pop(u).wait()
        if u < adding:
            piece = parts[steps[u // S][1]][u % S]
            add(piece, scratch[u % slots][: piece.numel()])
            if u >= adding - S and op == "avg":   # this slice of chunk r is now complete
                piece.div_(p)
        post_sends(u)   # first the forward of what just arrived: the neighbour waits for it
        post_recvs(u)
    for w in sends:
        w.wait()
    if buf is not None:
        _give_back(buf)


def _runner(slice_bytes: int, window: int | None, *, reduce: bool, gather: bool):
    """The steps for a driver of `ring`: the pipeline with S = `ring_slices` for the group."""
    if window is not None and window < 1:
        raise ValueError(f"window={window} must be >= 1 (receives posted ahead), or None")
    ring_slices(0, 1, 1, slice_bytes)  # a bad slice_bytes fails here, before any message

    def run(g: GroupView, chunks: list[torch.Tensor], op: str | None = None) -> None:
        numel = sum(c.numel() for c in chunks)
        S = ring_slices(numel, g.size, chunks[0].element_size(), slice_bytes)
        pipelined_ring(g, chunks, op, reduce=reduce, gather=gather, slices=S, window=window)
    return run


def sliced_ring_all_reduce(tensor: torch.Tensor, group=None, *, op: ReduceOpLike = "sum",
                           check: bool = True, slice_bytes: int = SLICE_BYTES,
                           window: int | None = None) -> torch.Tensor:
    """All-reduce `tensor` in place with the pipelined ring; returns it.

    2(p−1)·S messages per rank (S = `ring_slices`), 2(p−1)/p · n bytes, as the simple ring.
    `window`: reduce-scatter receives in flight, one scratch slice each (None: as many as
    `AHEAD_BYTES` holds, at least `WINDOW`; the same three functions take it).
    """
    run = _runner(slice_bytes, window, reduce=True, gather=True)
    return drive_all_reduce("sliced_ring_all_reduce", tensor, group, op, check, run)


def sliced_ring_reduce_scatter(output: torch.Tensor, input: torch.Tensor, group=None, *,
                               op: ReduceOpLike = "sum", check: bool = True,
                               slice_bytes: int = SLICE_BYTES, window: int | None = None
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
                           window: int | None = None) -> torch.Tensor:
    """`output` (flat layout) ← every rank's `input`, rank r's at chunk r (pipelined ring).

    Same contract as `ring_all_gather`; (p−1)·S messages per rank.
    """
    run = _runner(slice_bytes, window, reduce=False, gather=True)
    return drive_all_gather("sliced_ring_all_gather", output, input, group, check, run)
