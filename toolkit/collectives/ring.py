"""Ring algorithms: reduce-scatter, all-gather, and all-reduce as one then the other.

Ranks sit on a ring; at every step each rank sends one chunk (1/p of the tensor) to its right
neighbour and receives one from its left, all links busy at once (Patarasuk & Yuan 2009):

* reduce-scatter, p−1 steps: the chunk a rank receives is added to its own copy of that chunk and
  passed on next step; after p−1 steps rank r holds chunk r summed over all ranks.
* all-gather, p−1 steps: the finished chunks travel round the ring, overwriting.
* all-reduce = reduce-scatter + all-gather: 2(p−1) messages of n/p bytes per rank, so each rank
  sends 2(p−1)/p · n bytes, under 2n for any p, and the time is 2(p−1)α + 2(p−1)/p · nβ.

Tensors need not divide by p: chunks follow `chunk_sizes` (the first n mod p chunks hold one
extra element). Chunk r is the slice `chunk_bounds(n, p)[r]` of the flattened tensor, the same
layout as `torch.distributed.reduce_scatter_tensor` / `all_gather_into_tensor` when p divides n.
"""

from __future__ import annotations

from typing import Callable

import torch

from ._common import (
    GroupView, ReduceOpLike, agree, check_tensor, chunk_sizes, combine, exchange, finish_avg,
    flat_view, reduce_op, view,
)


def reduce_scatter_chunks(g: GroupView, chunks: list[torch.Tensor], op: str) -> None:
    """In place over `chunks` (views of one buffer): afterwards ``chunks[g.rank]`` is reduced.

    At step s rank r sends chunk (r − s − 1) mod p and receives chunk (r − s − 2) mod p, so the
    chunk arriving is the one it sends on at the next step, one contribution richer.
    """
    p, r = g.size, g.rank
    add = combine(op)
    scratch = torch.empty(max((c.numel() for c in chunks), default=0),
                          dtype=chunks[0].dtype, device=chunks[0].device)
    for s in range(p - 1):
        out_c, in_c = (r - s - 1) % p, (r - s - 2) % p
        buf = scratch[: chunks[in_c].numel()]
        exchange(g, send=chunks[out_c], dst=r + 1, recv=buf, src=r - 1)
        add(chunks[in_c], buf)
    finish_avg(op, chunks[r], p)


def all_gather_chunks(g: GroupView, chunks: list[torch.Tensor]) -> None:
    """In place: ``chunks[g.rank]`` is valid on entry; every chunk is valid on return.

    At step s rank r sends chunk (r − s) mod p and receives chunk (r − s − 1) mod p straight into
    its place in the buffer.
    """
    p, r = g.size, g.rank
    for s in range(p - 1):
        out_c, in_c = (r - s) % p, (r - s - 1) % p
        exchange(g, send=chunks[out_c], dst=r + 1, recv=chunks[in_c], src=r - 1)


def drive_all_reduce(name: str, tensor: torch.Tensor, group, op: ReduceOpLike, check: bool,
                     run: Callable[[GroupView, list[torch.Tensor], str], None]) -> torch.Tensor:
    """What every ring all-reduce shares: validate, agree, cut into chunks, `run` the steps on
    the chunks (views of the flattened tensor) in place, write back a non-contiguous tensor."""
    op = reduce_op(op, name)
    check_tensor(tensor, name, "tensor", op)
    g = view(group, name)
    if g.rank < 0 or g.size == 1:
        return tensor
    if check:
        agree(g, name, numel=tensor.numel(), dtype=tensor.dtype, device=tensor.device, op=op)
    flat, copied = flat_view(tensor)
    run(g, list(flat.split_with_sizes(chunk_sizes(flat.numel(), g.size))), op)
    if copied:
        tensor.copy_(flat.view_as(tensor))
    return tensor


def drive_reduce_scatter(name: str, output: torch.Tensor, input: torch.Tensor, group,
                         op: ReduceOpLike, check: bool,
                         run: Callable[[GroupView, list[torch.Tensor], str], None]
                         ) -> torch.Tensor:
    """Validate, agree, `run` the reduce-scatter steps on chunks of a copy of `input`, copy
    this rank's chunk into `output`."""
    op = reduce_op(op, name)
    check_tensor(input, name, "input", op)
    check_tensor(output, name, "output")
    g = view(group, name)
    if g.rank < 0:
        return output
    sizes = chunk_sizes(input.numel(), g.size)
    if output.numel() != sizes[g.rank] or output.dtype != input.dtype:
        raise ValueError(
            f"{name}: output has {output.numel()} {output.dtype} elements; rank {g.rank} of the "
            f"group needs {sizes[g.rank]} {input.dtype} (its chunk of the {input.numel()}-element "
            f"input split {g.size} ways: {sizes})")
    if check:
        agree(g, name, numel=input.numel(), dtype=input.dtype, device=input.device, op=op)
    work = input.reshape(-1).clone()
    chunks = list(work.split_with_sizes(sizes))
    run(g, chunks, op)
    output.copy_(chunks[g.rank].view_as(output))
    return output


def drive_all_gather(name: str, output: torch.Tensor, input: torch.Tensor, group, check: bool,
                     run: Callable[[GroupView, list[torch.Tensor]], None]) -> torch.Tensor:
    """Validate, agree, put `input` at this rank's chunk of `output`, `run` the all-gather steps
    on the chunks in place."""
    check_tensor(input, name, "input")
    check_tensor(output, name, "output")
    g = view(group, name)
    if g.rank < 0:
        return output
    sizes = chunk_sizes(output.numel(), g.size)
    if input.numel() != sizes[g.rank] or output.dtype != input.dtype:
        raise ValueError(
            f"{name}: input has {input.numel()} {input.dtype} elements; rank {g.rank} of the "
            f"group must contribute {sizes[g.rank]} {output.dtype} (its chunk of the "
            f"{output.numel()}-element output split {g.size} ways: {sizes})")
    if check:
        agree(g, name, numel=output.numel(), dtype=output.dtype, device=output.device)
    flat, copied = flat_view(output)
    chunks = list(flat.split_with_sizes(sizes))
    chunks[g.rank].copy_(input.reshape(-1))
    run(g, chunks)
    if copied:
        output.copy_(flat.view_as(output))
    return output


def _both(g: GroupView, chunks: list[torch.Tensor], op: str) -> None:
    reduce_scatter_chunks(g, chunks, op)
    all_gather_chunks(g, chunks)


def ring_all_reduce(tensor: torch.Tensor, group=None, *, op: ReduceOpLike = "sum",
                    check: bool = True) -> torch.Tensor:
    """All-reduce `tensor` in place by ring reduce-scatter then ring all-gather; returns it.

    Each rank sends 2(p−1) messages of about n/p elements (see the module docstring).
    """
    return drive_all_reduce("ring_all_reduce", tensor, group, op, check, _both)


def ring_reduce_scatter(output: torch.Tensor, input: torch.Tensor, group=None, *,
                        op: ReduceOpLike = "sum", check: bool = True) -> torch.Tensor:
    """`output` on rank r ← chunk r of the element-wise reduction of every rank's `input`.

    `input` (any shape, read as flat) is left unchanged; `output` must hold
    ``chunk_sizes(input.numel(), p)[r]`` elements. p−1 messages of about n/p per rank.
    """
    return drive_reduce_scatter("ring_reduce_scatter", output, input, group, op, check,
                                reduce_scatter_chunks)


def ring_all_gather(output: torch.Tensor, input: torch.Tensor, group=None, *,
                    check: bool = True) -> torch.Tensor:
    """`output` (flat layout) ← every rank's `input`, rank r's at chunk r; returns `output`.

    `input` on rank r must hold ``chunk_sizes(output.numel(), p)[r]`` elements. p−1 messages
    per rank.
    """
    return drive_all_gather("ring_all_gather", output, input, group, check, all_gather_chunks)
