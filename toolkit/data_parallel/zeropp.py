"""ZeRO++'s quantized collectives: weights all-gathered as int8 blocks (qwZ), gradients
reduce-scattered as int4 blocks through an all-to-all (qgZ).

Wang, Qin, Jacobs, Holmes, Rajbhandari, Ruwase, Yan, Yang & He, "ZeRO++: Extremely Efficient
Collective Communication for Giant Model Training", 2023, arXiv:2306.10209, §3. ZeRO-3 moves
three times M = 2Ψ bytes per step: the fp16 weights all-gathered for forward and again for
backward, the fp16 gradients reduce-scattered. ZeRO++ attacks each:

* **qwZ** (`quantized_all_gather`): each rank quantizes its weight shard to int8 in blocks, one
  scale per block (`quantize.block_quantize`; a scale per block, not per tensor, keeps one large
  value from flattening a whole tensor), and the all-gather carries codes and scales: 0.5M.
* **hpZ**: a second copy of the weights, sharded over the GPUs of one node only, serves the
  backward all-gather inside the node: 0 bytes across nodes for M/(GPUs per node) more memory.
  Not run here (it needs two levels of links); `toolkit.cost.compression.zeropp_volume` counts it.
* **qgZ** (`quantized_reduce_scatter`): a reduce-scatter built from a ring would dequantize,
  add and quantize again at each of its p − 1 hops, compounding the error. qgZ quantizes each
  rank's p gradient chunks once (int4 blocks), sends chunk j to rank j in one all-to-all, and
  rank j dequantizes and reduces in fp32: 0.25M. The paper runs it in two hops (inside the node,
  then across nodes, quantizing again between them); one group is one hop here.

Bytes passed in per rank (`toolkit.cost.compression.block_quantized_bytes`): qwZ all-gather
4·⌈c/B⌉ + c for a shard of c elements; qgZ all-to-all p·(4·⌈c/B⌉ + ⌈c/2⌉) for a gradient of
p·c. Shapes: shards (c,), full vectors (p·c,), on the input's device; results fp32.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from ..arguments import check_int
from .compression import all_gather_flat
from .quantize import (
    block_dequantize, block_quantize, from_payload, pack_int4, to_payload, unpack_int4,
)

__all__ = ["quantized_all_gather", "quantized_reduce_scatter"]


def _encode(x: Tensor, *, bits: int, block: int) -> Tensor:
    codes, scales = block_quantize(x, bits=bits, block=block)
    packed = pack_int4(codes) if bits == 4 else codes.view(torch.uint8)
    return to_payload(scales, packed)


def _decode(payload: Tensor, n: int, *, bits: int, block: int) -> Tensor:
    blocks = -(-n // block)
    packed_bytes = (n + 1) // 2 if bits == 4 else n
    scales, packed = from_payload(payload, [(torch.float32, blocks), (torch.uint8, packed_bytes)])
    codes = unpack_int4(packed, n) if bits == 4 else packed.view(torch.int8)
    return block_dequantize(codes, scales, block=block)


def quantized_all_gather(shard: Tensor, *, bits: int = 8, block: int = 256,
                         group: Any = None) -> Tensor:
    """qwZ: every rank's ``shard`` (c,), block-quantized, gathered in rank order: (p·c,) fp32.
    Each element is within half its block's scale of the exact gather."""
    check_int("quantized_all_gather", "block", block)
    world = dist.get_world_size(group)
    n = shard.numel()
    gathered = all_gather_flat(_encode(shard.reshape(-1), bits=bits, block=block), group)
    rows = gathered.view(world, -1)
    return torch.cat([_decode(row, n, bits=bits, block=block) for row in rows])


def quantized_reduce_scatter(full: Tensor, *, bits: int = 4, block: int = 256,
                             group: Any = None, average: bool = True) -> Tensor:
    """qgZ, one hop: this rank's chunk (c,) of the sum (``average``: the mean) over ranks of
    ``full`` (p·c,), each chunk block-quantized once and sent by one all-to-all."""
    check_int("quantized_reduce_scatter", "block", block)
    world = dist.get_world_size(group)
    if full.numel() % world:
        raise ValueError(f"quantized_reduce_scatter: the input's {full.numel()} elements do not "
                         f"split into {world} equal chunks; pad it to a multiple of {world}")
    c = full.numel() // world
    payload = torch.stack([_encode(chunk, bits=bits, block=block)
                           for chunk in full.reshape(world, c)])        # (p, bytes per chunk)
    received = torch.empty_like(payload)
    dist.all_to_all_single(received, payload, group=group)  # row i: rank i's copy of my chunk
    total = sum(_decode(row, c, bits=bits, block=block) for row in received)
    return total / world if average else total
