"""Quantized and sparsified gradients as a DDP communication hook: QSGD, top-k, scaled sign.

Each rank compresses its bucket's gradient (`toolkit.data_parallel.quantize`), the ranks
all-gather the compressed payloads (one uint8 vector each, the same size on every rank), and
every rank decompresses all p of them and averages: the same mean on every rank, so the replicas
stay equal. All-gather, not all-reduce, because a sum of codes is not a code: p top-k vectors
have up to p·k nonzeros, and adding QSGD's codes would need wider integers. Per step and bucket
of n elements a rank passes in (`toolkit.cost.compression`):

    method  compressor                                                   bytes passed in
    qsgd    stochastic, unbiased, s levels per block of d (QSGD §3.1)    4⌈n/d⌉ + ⌈n·b/8⌉
    topk    the k = ⌈density·n⌉ largest |entries| (Stich et al. 2018)    8k
    sign    (‖x‖₁/n)·sign(x) (Karimireddy et al. 2019)                   4 + ⌈n/8⌉

against 4n for the fp32 all-reduce. On the wire a ring all-reduce sends 2(p − 1)/p·4n per rank
and an all-gather (p − 1)·payload, so gathering pays only while the payload is under 8n/p
bytes; at scale the exchange is an all-to-all instead, each rank reducing one chunk (1-bit
Adam's compressed all-reduce, ZeRO++'s qgZ: `toolkit.data_parallel.onebit_adam`, `zeropp`).

Error feedback (``error_feedback=True``, `quantize.ErrorFeedback`): a rank adds what its
compressor dropped last step to this step's gradient, a = g + e, sends C(a), and keeps
e = a − C(a). Top-k and sign need it: without it, coordinates that never make the top-k are
never updated (lesson 15 measures it). QSGD is unbiased and converges without it, slower by its
variance.

`compressed_hook(state, bucket)` has the signature of torch's DDP communication hooks, like
`powersgd.powersgd_hook`: register it with ``register_comm_hook(state, compressed_hook)`` on
torch's ``DistributedDataParallel`` or the course's `BucketedDDP` / `OverlappedDDP`. Every
collective is issued and waited for on the calling thread (lesson 15 shows why torch's chained
futures hang on gloo), and it returns a completed future.

Shapes: the bucket's flat buffer (N,); memory (N,) per bucket; payloads (bytes,) uint8 on the
buffer's device.
"""

# No `from __future__ import annotations`: torch's register_comm_hook checks that the hook's
# `bucket` annotation *is* dist.GradBucket, which a string annotation is not.
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from ..arguments import check_int
from ..comm.flat import gather_into
from ..cost.compression import code_bits, topk_count
from .powersgd import completed
from .quantize import (
    ErrorFeedback, from_payload, pack_int4, pack_signs, qsgd_dequantize, qsgd_quantize,
    sign_decompress, to_payload, topk_compress, topk_decompress, unpack_int4,
)

__all__ = ["METHODS", "CompressionState", "all_gather_flat", "compressed_hook"]

METHODS = ("qsgd", "topk", "sign")


@dataclass
class CompressionState:
    """Settings and per-bucket memory of `compressed_hook` (one per DDP model)."""

    method: str = "topk"
    """One of `METHODS`."""
    density: float = 0.01
    """top-k: the fraction of entries sent, k = ⌈density·n⌉ per bucket."""
    levels: int = 4
    """QSGD: s, levels per sign (codes of 4 bits for s ≤ 7, else 8)."""
    block: int = 256
    """QSGD: d, elements sharing one norm."""
    error_feedback: bool = True
    """Add last step's compression error to the gradient."""
    start_iter: int = 0
    """Backward passes with a plain fp32 all-reduce before compressing."""
    seed: int = 0
    """QSGD's rounding: seeded by (seed, rank, step, bucket), independent across ranks."""
    process_group: Any = None
    """The group to average over (None: the default group)."""
    iter: int = 0
    """Backward passes seen so far."""
    memory: ErrorFeedback = field(default_factory=ErrorFeedback, repr=False)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"CompressionState: method must be one of {METHODS}, "
                             f"got {self.method!r}")
        topk_count(1, self.density)                     # validates density
        code_bits(self.levels)                          # validates levels
        check_int("CompressionState", "block", self.block, hint="d")
        check_int("CompressionState", "start_iter", self.start_iter, low=0)


def all_gather_flat(payload: Tensor, group: Any = None) -> Tensor:
    """Every rank's ``payload`` (same size everywhere) concatenated in rank order: (p·size,).
    (`toolkit.comm.flat.gather_into`: one name on every torch in range)."""
    world = dist.get_world_size(group)
    out = payload.new_empty(world * payload.numel())
    gather_into(out, payload.contiguous(), group=group)
    return out


def _generator(state: CompressionState, rank: int, step: int, key: int,
               device: torch.device) -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed(((state.seed * 1_000_003 + rank) * 1_009 + step) * 101 + key)
    return gen


def _compress(state: CompressionState, meant: Tensor, *, rank: int, step: int,
              key: int) -> tuple[Tensor, list[tuple[torch.dtype, int]]]:
    """This rank's payload (uint8) and the specs that split any rank's payload back."""
    n = meant.numel()
    if state.method == "topk":
        k = topk_count(n, state.density)
        values, indices = topk_compress(meant, k)
        return to_payload(values, indices), [(torch.float32, k), (torch.int32, k)]
    if state.method == "sign":
        return (to_payload(meant.float().abs().mean().reshape(1), pack_signs(meant)),
                [(torch.float32, 1), (torch.uint8, (n + 7) // 8)])
    codes, norms = qsgd_quantize(meant, levels=state.levels, block=state.block,
                                 generator=_generator(state, rank, step, key, meant.device))
    packed = pack_int4(codes) if code_bits(state.levels) == 4 else codes.view(torch.uint8)
    return to_payload(norms, packed), [(torch.float32, norms.numel()),
                                       (torch.uint8, packed.numel())]


def _decompress(state: CompressionState, parts: list[Tensor], n: int) -> Tensor:
    if state.method == "topk":
        return topk_decompress(parts[0], parts[1], n)
    if state.method == "sign":
        return sign_decompress(parts[1], parts[0], n)
    norms, packed = parts
    codes = unpack_int4(packed, n) if code_bits(state.levels) == 4 else packed.view(torch.int8)
    return qsgd_dequantize(codes, norms, levels=state.levels, block=state.block)


def compressed_hook(state: CompressionState,
                    bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """A DDP communication hook: average ``bucket``'s gradient through ``state.method``.

    ``bucket``: torch's ``dist.GradBucket`` or the course's `HookBucket` (``buffer()``,
    ``index()``, ``is_last()``). Returns a completed future holding the buffer, now the mean
    over ranks of every rank's compressed gradient."""
    group = state.process_group
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    buffer = bucket.buffer()
    key, step = bucket.index(), state.iter
    if bucket.is_last():        # one step per backward, counted after its last bucket
        state.iter += 1
    if step < state.start_iter:
        buffer.div_(world)
        dist.all_reduce(buffer, group=group)
        return completed(buffer)
    n = buffer.numel()
    meant = (state.memory.compensate(key, buffer) if state.error_feedback
             else buffer.clone()).float()                             # a = g + e, (N,)
    payload, specs = _compress(state, meant, rank=rank, step=step, key=key)
    gathered = all_gather_flat(payload, group).view(world, -1)        # (p, bytes)
    total = torch.zeros(n, dtype=torch.float32, device=buffer.device)
    applied = total
    for r in range(world):
        mine = _decompress(state, from_payload(gathered[r], specs), n)
        total = total + mine
        if r == rank:
            applied = mine                                            # C(a), as every rank saw it
    if state.error_feedback:
        state.memory.remember(key, meant, applied)                    # e = a − C(a)
    buffer.copy_(total.div_(world))
    return completed(buffer)
