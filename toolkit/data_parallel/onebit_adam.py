"""1-bit Adam: Adam's variance frozen after a warm-up, then its momentum sent at one bit per
number, with the compression error fed back on both sides of the exchange.

Tang, Gan, Awan, Rajbhandari, Li, Lian, Liu, Zhang & He, "1-bit Adam: Communication Efficient
Large-Scale Training with Adam's Convergence Speed", ICML 2021, arXiv:2102.02888, Algorithm 1.
Error feedback (`quantize.ErrorFeedback`) rescues biased compressors for SGD, whose update is
linear in the gradient: what is dropped now is applied later. Adam's update m/√v is not linear,
and v (the running mean of g², which compression distorts) sets the step of every coordinate,
so error feedback on Adam's gradient does not converge like Adam (the paper's motivation). Its
observation: after a warm-up, v changes slowly. So

    warm-up, t ≤ T_w:   plain Adam on the fp32 all-reduced gradient (4Ψ bytes per step)
    then:               v frozen at v(T_w)
                        mᵢ ← β₁·m + (1 − β₁)·gᵢ            each rank, its own gradient
                        m  ← 1-bit all-reduce mean of mᵢ  (`onebit_allreduce`)
                        x  ← x − lr · m / (√v + ε)        linear in m: error feedback works

`onebit_allreduce` is their error-compensated compressed all-reduce, built on an all-to-all:
every rank adds its worker error, splits the vector into p chunks and sends chunk j, as scaled
signs (`quantize.sign_compress`: one bit per number and a 4-byte scale per chunk), to rank j;
rank j averages the p versions of its chunk, adds its server error, compresses again, and an
all-gather returns every chunk to every rank. Both errors are kept for the next step. Bytes
passed in per rank: p·(c/8 + 4) + (c/8 + 4) with c = ⌈Ψ/p⌉ rounded up to whole bytes
(`toolkit.cost.compression.onebit_allreduce_bytes`), against 4Ψ: 32p/(p + 1)× less, 21× at
p = 2, approaching 32× as p grows.

Here the warm-up uses Adam's bias corrections (as ``torch.optim.Adam``) and v̂ = v/(1 − β₂^T_w)
is frozen; after warm-up the momentum's correction 1/(1 − β₁ᵗ) is applied as well (≈ 1 by then).
No weight decay. Every parameter of the optimizer is flattened into one (Ψ,) vector on the
parameters' device and dtype; the replicas stay bitwise equal, since every rank applies the same
all-gathered m. Rank 0's parameters are broadcast at construction.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
import torch.distributed as dist
from torch import Tensor

from ..arguments import check_int
from ..cost.compression import onebit_chunk
from .compression import all_gather_flat
from .quantize import from_payload, sign_compress, sign_decompress, to_payload

__all__ = ["OneBitAdam", "onebit_allreduce"]


def _signed(x: Tensor, block: int | None) -> Tensor:
    """One chunk as its payload: [scales (4 bytes each) | signs (c/8 bytes)]."""
    packed, scales = sign_compress(x, block=block)
    return to_payload(scales, packed)


def _unsigned(payload: Tensor, c: int, block: int | None) -> Tensor:
    scales = 1 if block is None else -(-c // block)
    scale, packed = from_payload(payload, [(torch.float32, scales), (torch.uint8, c // 8)])
    return sign_decompress(packed, scale, c, block=block)


def onebit_allreduce(x: Tensor, *, worker_error: Tensor, server_error: Tensor,
                     group: Any = None, block: int | None = None) -> Tensor:
    """The mean over ranks of x (n,), through 1-bit compression on both sides.

    ``worker_error`` (p·c,) and ``server_error`` (c,) are this rank's memories (c =
    `onebit_chunk`(n, p)), updated in place; ``block``: elements per scale (None: one scale per
    chunk). Returns (n,) fp32, the same on every rank."""
    world = dist.get_world_size(group)
    n = x.numel()
    c = onebit_chunk(n, world)
    if worker_error.numel() != world * c or server_error.numel() != c:
        raise ValueError(f"onebit_allreduce: errors must have {world * c} and {c} elements for "
                         f"n = {n} over {world} ranks, got {worker_error.numel()} and "
                         f"{server_error.numel()}")
    padded = torch.zeros(world * c, dtype=torch.float32, device=x.device)
    padded[:n] = x.reshape(-1)
    meant = (padded + worker_error).view(world, c)                      # (p, c)
    payload = torch.stack([_signed(chunk, block) for chunk in meant])   # (p, scales + c/8)
    applied = torch.stack([_unsigned(row, c, block) for row in payload])
    worker_error.copy_((meant - applied).reshape(-1))
    received = torch.empty_like(payload)
    dist.all_to_all_single(received, payload, group=group)  # row i: rank i's copy of my chunk
    mine = sum(_unsigned(row, c, block) for row in received) / world   # (c,), my chunk
    meant_server = mine + server_error
    out = _signed(meant_server, block)
    server_error.copy_(meant_server - _unsigned(out, c, block))
    chunks = all_gather_flat(out, group).view(world, -1)               # every rank's chunk
    return torch.cat([_unsigned(row, c, block) for row in chunks])[:n]


class OneBitAdam(torch.optim.Optimizer):
    """Adam for ``warmup_steps`` on all-reduced gradients, then 1-bit compressed momentum
    (module docstring). Use it *instead of* DDP: it averages the gradients itself.

    ``step()`` returns True on compressed steps. ``frozen`` is v̂ once frozen (else None).
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, *,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 warmup_steps: int = 100, block: int | None = None,
                 process_group: Any = None, broadcast: bool = True) -> None:
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("OneBitAdam needs an initialised process group (start ranks "
                               "with toolkit.launch.spawn or torchrun)")
        check_int("OneBitAdam", "warmup_steps", warmup_steps, hint="T_w, Adam steps first")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps))
        self.params = [p for g in self.param_groups for p in g["params"]]
        if len({(p.dtype, p.device) for p in self.params}) != 1:
            raise ValueError("OneBitAdam: every parameter must share one dtype and device")
        self.group, self.warmup_steps, self.block = process_group, warmup_steps, block
        self.world_size = dist.get_world_size(process_group)
        first = self.params[0]
        self.numel = sum(p.numel() for p in self.params)
        c = onebit_chunk(self.numel, self.world_size)
        self.m = torch.zeros(self.numel, dtype=torch.float32, device=first.device)
        self.v = torch.zeros_like(self.m)
        self.frozen: Tensor | None = None
        self.live: Tensor | None = None
        self.worker_error = torch.zeros(self.world_size * c, device=first.device)
        self.server_error = torch.zeros(c, device=first.device)
        self.t = 0
        if broadcast:
            src = 0 if process_group is None else dist.get_global_rank(process_group, 0)
            with torch.no_grad():
                for p in self.params:
                    dist.broadcast(p.data, src=src, group=process_group)

    def _flat_grad(self) -> Tensor:
        return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in self.params]).float()

    @torch.no_grad()
    def step(self, closure: Any = None) -> bool:  # type: ignore[override]
        if closure is not None:
            with torch.enable_grad():
                closure()
        group = self.param_groups[0]
        (b1, b2), eps, lr = group["betas"], group["eps"], group["lr"]
        self.t += 1
        g = self._flat_grad()                                           # (Ψ,)
        compressed = self.t > self.warmup_steps
        if not compressed:
            g.div_(self.world_size)
            dist.all_reduce(g, group=self.group)                        # 4Ψ bytes
            self.m.mul_(b1).add_(g, alpha=1 - b1)
            self.v.mul_(b2).addcmul_(g, g, value=1 - b2)
            v_hat = self.v / (1 - b2 ** self.t)
            if self.t == self.warmup_steps:
                self.frozen = v_hat.clone()                             # v frozen from here on
                # A coordinate with v = 0 had no gradient in the whole warm-up (a dead ReLU
                # unit): its 1-bit momentum would be ±scale divided by ε. Keep it still.
                self.live = self.frozen > 0
        else:
            local = self.m * b1 + g * (1 - b1)                          # mᵢ, this rank's
            self.m = onebit_allreduce(local, worker_error=self.worker_error,
                                      server_error=self.server_error, group=self.group,
                                      block=self.block)
            v_hat = self.frozen
        update = (self.m / (1 - b1 ** self.t)) / (v_hat.sqrt() + eps)   # (Ψ,)
        if compressed:
            update.mul_(self.live)
        offset = 0
        for p in self.params:
            p.sub_(update[offset: offset + p.numel()].view_as(p).to(p.dtype), alpha=lr)
            offset += p.numel()
        return compressed
