"""Lab 02: distributed data parallel (DDP) from scratch: buckets, overlap, no_sync.

Every rank holds the whole model and trains on its own 1/p of the batch. Rank r's loss is the
mean over its items, so the full-batch gradient is the *average* of the p ranks' gradients
(Li et al., "PyTorch Distributed", VLDB 2020, section 2). `DDP` below makes that happen while
backward is still running:

1. At construction, every rank copies rank 0's parameters *and buffers* (`dist.broadcast`), so
   the replicas start identical.
2. Gradients are packed into flat *buckets* of about ``bucket_cap_mb`` MiB, in *reverse*
   parameter order (backward produces the last layer's gradients first): `assign_buckets`.
3. A hook fires as soon as a parameter's gradient is final; when a bucket holds all its
   gradients, its all-reduce starts with ``async_op=True`` while autograd keeps computing
   earlier layers (overlap). Buckets start in index order on every rank.
4. At the end of backward (`finish`, called for you before ``loss.backward()`` returns),
   buckets that never filled (a parameter got no gradient this step) start with zeros in its
   slot, then you wait for every handle, divide by p and copy the averages into ``.grad``.
5. Inside ``with ddp.no_sync():``, forward and backward send nothing: gradients accumulate
   locally and the next synchronised backward reduces the sum.

Allowed: `dist.all_reduce`, `dist.broadcast` (and `dist.barrier`). `toolkit.data_parallel`
(the course's own DDP) cannot be imported in the grader's ranks. All parameters share one
dtype (float32 in the checks).

Run `autograder grade .` in this folder to check your work; README.md explains each check.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd import Variable


def assign_buckets(params: Sequence[torch.Tensor], cap_bytes: int) -> list[list[int]]:
    """Group parameters into buckets; return each bucket's indices into ``params``.

    Walk the parameters from the *last* to the first, adding each to the open bucket, and close
    the bucket as soon as it holds ``cap_bytes`` bytes or more (so a bucket may pass the cap by
    its last tensor, and a tensor bigger than the cap sits alone). Bytes = numel × element_size.
    Buckets come out in launch order, each listing indices in the order they were added:

        sizes (bytes) 400, 400, 1200 with cap_bytes=1000  ->  [[2], [1, 0]]
    """
    ### BEGIN SOLUTION
    buckets, current, filled = [], [], 0
    for i in range(len(params) - 1, -1, -1):
        current.append(i)
        filled += params[i].numel() * params[i].element_size()
        if filled >= cap_bytes:
            buckets.append(current)
            current, filled = [], 0
    if current:  # the first parameters, in a bucket below the cap
        buckets.append(current)
    return buckets
    ### END SOLUTION
    ### HINT: loop i from len(params) - 1 down to 0; keep the open bucket and its byte count;
    ### HINT: close it when the count reaches cap_bytes; don't forget the last, partial bucket.


def broadcast_from_rank0(module: nn.Module) -> None:
    """Overwrite every parameter and every buffer of ``module`` with rank 0's values."""
    ### BEGIN SOLUTION
    for tensor in [*module.parameters(), *module.buffers()]:
        dist.broadcast(tensor.detach(), src=0)  # detach(): same storage, outside autograd
    ### END SOLUTION
    ### HINT: dist.broadcast(tensor, src=0) writes rank 0's values into `tensor` on every rank;
    ### HINT: module.parameters() and module.buffers() list what a replica holds.


class DDP(nn.Module):
    """Wrap ``module``: ``DDP(module)(x)`` runs ``module(x)``; after ``loss.backward()`` every
    trainable parameter's ``.grad`` is the average over ranks (zeros for a parameter that no
    rank used this step). Frozen parameters (``requires_grad=False``) are never sent; a weight
    tied into two layers is one parameter, sent once."""

    def __init__(self, module: nn.Module, bucket_cap_mb: float = 25.0) -> None:
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        # parameters() lists a tied tensor once; frozen ones never get a gradient.
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.cap_bytes = max(1, int(bucket_cap_mb * 2**20))  # MiB, as PyTorch counts them
        self.require_backward_grad_sync = True  # no_sync() sets it to False
        self._sync_this_backward = True
        self._callback_queued = False
        ### BEGIN SOLUTION
        broadcast_from_rank0(self.module)
        self.buckets = [[self.params[i] for i in idx]
                        for idx in assign_buckets(self.params, self.cap_bytes)]
        self.flat = [torch.zeros(sum(p.numel() for p in b), dtype=b[0].dtype, device=b[0].device)
                     for b in self.buckets]
        self.where = {}  # id(param) -> (bucket index, first element in its flat buffer)
        for k, bucket in enumerate(self.buckets):
            start = 0
            for p in bucket:
                self.where[id(p)] = (k, start)
                start += p.numel()
        self.packed = [set() for _ in self.buckets]  # ids packed in this backward
        self.handles = [None] * len(self.buckets)    # running all-reduces
        self.next_bucket = 0                          # first bucket not started yet
        ### END SOLUTION
        ### HINT: broadcast; then, with assign_buckets: self.buckets (lists of parameters), a
        ### HINT: flat zero buffer per bucket, where each parameter's slice starts, and per
        ### HINT: bucket what was packed this backward and its all-reduce handle; plus
        ### HINT: self.next_bucket, the index of the first bucket not started yet (from 0).
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._on_grad_ready)

    def forward(self, *args, **kwargs):
        # As in PyTorch, forward decides whether the coming backward synchronises.
        self._sync_this_backward = self.require_backward_grad_sync
        return self.module(*args, **kwargs)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Forward and backward inside this block only accumulate gradients locally."""
        ### BEGIN SOLUTION
        before = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = before
        ### END SOLUTION
        ### HINT: switch self.require_backward_grad_sync off, yield, then restore it (try/finally).

    # -- given: how the hooks reach your code -------------------------------------------------

    def _on_grad_ready(self, param: nn.Parameter) -> None:
        """Autograd calls this once per parameter per backward, right after ``param.grad`` is
        final (tied weights: after both uses were added). The first call of a backward asks
        the autograd engine to call `finish` once the whole graph is done, still inside
        ``loss.backward()`` (PyTorch FSDP uses the same ``queue_callback``)."""
        if not self._sync_this_backward:
            return
        if not self._callback_queued:
            self._callback_queued = True
            Variable._execution_engine.queue_callback(self._end_of_backward)
        self.grad_ready(param)

    def _end_of_backward(self) -> None:
        self._callback_queued = False
        self.finish()

    # -- yours ------------------------------------------------------------------------------

    @torch.no_grad()
    def grad_ready(self, param: nn.Parameter) -> None:
        """Copy ``param.grad`` into its bucket; start every bucket that is now full, in order."""
        ### BEGIN SOLUTION
        k, start = self.where[id(param)]
        self.flat[k][start:start + param.numel()].copy_(param.grad.reshape(-1))
        self.packed[k].add(id(param))
        self.start_full_buckets()
        ### END SOLUTION
        ### HINT: find the parameter's bucket and slice, copy the gradient in, mark it packed,
        ### HINT: then start the buckets that are now full (start_full_buckets).

    def start_full_buckets(self) -> None:
        """Start the all-reduce of bucket ``self.next_bucket``, then the next, ... while the
        bucket holds all its gradients; stop at the first that does not. Every rank must start
        the same buckets in the same order: collectives pair up by call order."""
        ### BEGIN SOLUTION
        while self.next_bucket < len(self.buckets):
            k = self.next_bucket
            if len(self.packed[k]) < len(self.buckets[k]):
                return
            self.handles[k] = dist.all_reduce(self.flat[k], async_op=True)
            self.next_bucket += 1
        ### END SOLUTION
        ### HINT: handle = dist.all_reduce(flat_buffer, async_op=True) returns at once; keep the
        ### HINT: handle, the all-reduce runs while autograd computes earlier layers.

    @torch.no_grad()
    def finish(self) -> None:
        """End of backward: pack what is missing, start the rest, wait, average, write .grad."""
        ### BEGIN SOLUTION
        for k in range(self.next_bucket, len(self.buckets)):
            for p in self.buckets[k]:
                if id(p) not in self.packed[k]:  # no gradient this step: zeros (or no_sync's sum)
                    _, start = self.where[id(p)]
                    piece = self.flat[k][start:start + p.numel()]
                    if p.grad is None:
                        piece.zero_()
                    else:
                        piece.copy_(p.grad.reshape(-1))
                    self.packed[k].add(id(p))
        self.start_full_buckets()
        for k, bucket in enumerate(self.buckets):
            self.handles[k].wait()
            self.flat[k].div_(self.world_size)  # the sum over ranks -> the mean
            for p in bucket:
                _, start = self.where[id(p)]
                mean = self.flat[k][start:start + p.numel()].view_as(p)
                if p.grad is None:
                    p.grad = mean.clone()
                else:
                    p.grad.copy_(mean)
            self.packed[k].clear()
            self.handles[k] = None
        self.next_bucket = 0
        ### END SOLUTION
        ### HINT: buckets from self.next_bucket on are not full: copy p.grad (zeros if None) in
        ### HINT: for the parameters still missing, and start them. Then, for every bucket: wait,
        ### HINT: divide by the world size, copy each slice back into p.grad; reset for next step.
