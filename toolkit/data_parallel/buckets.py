"""Gradient buckets: which parameters share one all-reduce, and the flat buffer they share.

PyTorch DDP (Li et al., "PyTorch Distributed", VLDB 2020, section 3.2) does not all-reduce
each gradient on its own: one all-reduce costs α + nβ (lesson 03), so a model with hundreds of
small tensors would pay hundreds of α. It packs gradients into flat *buckets* of at most
about ``bucket_cap_mb`` (default 25 MB) and all-reduces each bucket once. Buckets follow *reverse*
parameter order, because backward produces the last layer's gradients first: the first bucket
fills (and can be sent) while the earlier layers are still computing theirs.

`assign_buckets` is the pure rule (parameters in, lists of indices out); `Bucket` holds one
bucket's flat buffer and copies gradients in (`pack`) and averaged gradients out (`unpack`).
A parameter larger than the cap gets a bucket of its own; buckets never mix dtypes (one flat
buffer has one dtype). PyTorch also makes its first bucket small (1 MB) so that communication
starts early; this module keeps one cap for all buckets, which is simpler to read and to test.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor, nn

from ..arguments import check_int, check_positive

__all__ = ["DEFAULT_BUCKET_CAP_MB", "Bucket", "HookBucket", "assign_buckets", "bucket_cap_bytes"]

DEFAULT_BUCKET_CAP_MB = 25.0
"""PyTorch DDP's default ``bucket_cap_mb`` (MiB of gradients per bucket)."""


def bucket_cap_bytes(bucket_cap_mb: float) -> int:
    """``bucket_cap_mb`` in bytes, as PyTorch counts it (1 MB = 2**20 bytes)."""
    check_positive("", "bucket_cap_mb", bucket_cap_mb, hint="MiB")
    return max(1, int(bucket_cap_mb * 2**20))


def assign_buckets(params: Sequence[Tensor], cap_bytes: int) -> list[list[int]]:
    """Group ``params`` (indices into the sequence) into buckets of at most ``cap_bytes``.

    Walks the parameters in *reverse* order (the order backward makes their gradients), adds
    each to the open bucket, and closes the bucket as soon as it holds at least ``cap_bytes``
    (PyTorch's rule in ``compute_bucket_assignment_by_size``: a bucket may pass the cap by its
    last tensor, and a tensor bigger than the cap fills a bucket alone). A change of dtype also
    closes a bucket. Returns the buckets in launch order, each a list of indices in the order
    they were added.

        >>> w = [torch.zeros(100), torch.zeros(100), torch.zeros(300)]   # 400, 400, 1200 bytes
        >>> assign_buckets(w, cap_bytes=1000)
        [[2], [1, 0]]
    """
    check_int("assign_buckets", "cap_bytes", cap_bytes)
    buckets: list[list[int]] = []
    current: list[int] = []
    size, dtype = 0, None
    for i in reversed(range(len(params))):
        p = params[i]
        if current and p.dtype != dtype:
            buckets.append(current)
            current, size = [], 0
        current.append(i)
        size += p.numel() * p.element_size()
        dtype = p.dtype
        if size >= cap_bytes:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


class Bucket:
    """One flat gradient buffer shared by a few parameters, all-reduced as one tensor.

    Parameter ``params[j]`` owns ``buffer[offsets[j] : offsets[j] + numel]``. The state a
    overlapped DDP needs during backward (how many gradients are still missing, the handle of
    the running all-reduce) lives here too, so that the DDP classes stay short.
    """

    def __init__(self, index: int, params: Sequence[nn.Parameter]) -> None:
        if not params:
            raise ValueError("Bucket: params must not be empty")
        dtypes = {p.dtype for p in params}
        if len(dtypes) != 1:
            raise ValueError(f"Bucket: params must share one dtype, got {sorted(map(str, dtypes))}")
        self.index = index
        self.params = list(params)
        self.offsets: list[int] = []
        total = 0
        for p in self.params:
            self.offsets.append(total)
            total += p.numel()
        self.numel = total
        self.buffer = torch.zeros(total, dtype=self.params[0].dtype, device=self.params[0].device)
        self.slot = {id(p): j for j, p in enumerate(self.params)}
        self.pending = len(self.params)   # gradients not yet packed in this backward
        self.packed: set[int] = set()     # ids of the parameters packed in this backward
        self.work = None                  # handle of this bucket's async all-reduce, if running

    @property
    def nbytes(self) -> int:
        return self.numel * self.buffer.element_size()

    def view(self, param: nn.Parameter) -> Tensor:
        """The slice of the flat buffer that belongs to ``param``, shaped like it."""
        j = self.slot[id(param)]
        return self.buffer[self.offsets[j]: self.offsets[j] + param.numel()].view_as(param)

    def pack(self, param: nn.Parameter) -> None:
        """Copy ``param.grad`` (zeros if it has none) into its slice; count it as ready."""
        if id(param) in self.packed:
            return
        if param.grad is not None and param.grad.layout != torch.strided:
            raise ValueError(f"Bucket: only dense gradients can be bucketed, got a "
                             f"{param.grad.layout} gradient of shape {tuple(param.shape)}")
        if param.grad is None:
            self.view(param).zero_()
        else:
            self.view(param).copy_(param.grad)
        self.packed.add(id(param))
        self.pending -= 1

    def pack_missing(self) -> None:
        """Pack every parameter not packed yet: the ones that got no gradient contribute zeros."""
        for p in self.params:
            self.pack(p)

    def unpack(self) -> None:
        """Write the (reduced) buffer back into each parameter's ``.grad``; reset for next time."""
        for p in self.params:
            if p.grad is None:
                p.grad = self.view(p).clone()
            else:
                p.grad.copy_(self.view(p))
        self.reset()

    def reset(self) -> None:
        self.pending = len(self.params)
        self.packed.clear()
        self.work = None

    def __repr__(self) -> str:
        return f"Bucket({self.index}, {len(self.params)} params, {self.nbytes:,} bytes)"


class HookBucket:
    """A `Bucket` seen through the interface of torch's ``dist.GradBucket``, so one DDP
    communication hook (``hook(state, bucket) -> Future``) runs on torch's DDP and the course's:
    ``buffer()`` (the flat gradients), ``gradients()`` (views of it shaped like the
    parameters), ``parameters()``, ``index()``, ``is_last()``."""

    def __init__(self, bucket: Bucket, *, is_last: bool) -> None:
        self._bucket, self._is_last = bucket, is_last

    def buffer(self) -> Tensor:
        return self._bucket.buffer

    def gradients(self) -> list[Tensor]:
        return [self._bucket.view(p) for p in self._bucket.params]

    def parameters(self) -> list[nn.Parameter]:
        return list(self._bucket.params)

    def index(self) -> int:
        return self._bucket.index

    def is_last(self) -> bool:
        return self._is_last
