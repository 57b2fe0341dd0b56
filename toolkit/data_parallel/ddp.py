"""Distributed data parallel from scratch, in three steps a reader can compare side by side.

Data parallelism: every rank holds the whole model and a different slice of the batch. If rank
r's loss is the mean over its B/p items, the gradient of the mean over all B items is the
*average* of the p ranks' gradients (the gradient is linear in the loss), so after one
all-reduce (sum, then divide by p) every rank holds the full-batch gradient, takes the same
optimizer step, and the replicas stay identical (Li et al., "PyTorch Distributed: Experiences
on Accelerating Data Parallel Training", VLDB 2020).

=================  ===============================  =====================================
class              all-reduces per step             when
=================  ===============================  =====================================
`NaiveDDP`         one per parameter                after backward
`BucketedDDP`      one per bucket (`buckets.py`)    after backward
`OverlappedDDP`    one per bucket                   during backward, async, as soon as a
                                                    bucket's gradients are all ready
=================  ===============================  =====================================

All three wait for their all-reduces *inside* ``loss.backward()``: the first gradient hook of a
backward queues a callback with the autograd engine
(``Variable._execution_engine.queue_callback``, as PyTorch FSDP does), which runs when the
engine has finished the whole graph. So ``loss.backward(); optimizer.step()`` is all a training
loop needs, as with ``torch.nn.parallel.DistributedDataParallel``.

The conventional surface: ``DDP(module)`` broadcasts rank 0's parameters and buffers at
construction, ``ddp(x)`` calls ``ddp.module(x)``, gradients come out averaged, ``no_sync()``
skips communication for gradient accumulation (decided at forward time, as in PyTorch, so run
forward and backward inside it). Edge cases:

* tied weights: ``module.parameters()`` yields a shared tensor once, and its post-accumulate
  hook fires once per backward, after both uses were summed: reduced exactly once;
* frozen parameters (``requires_grad=False``): never bucketed, never reduced;
* a parameter with no gradient in a step (a branch not taken): at the end of backward its
  bucket still fires, with zeros in its slot, as PyTorch does with
  ``find_unused_parameters=True``. Every rank therefore makes the same all-reduces in the same
  order and nobody hangs. Unlike PyTorch we then write the averaged gradient (zeros if no rank
  used it) instead of leaving ``.grad`` as None: PyTorch needs one more all-reduce of a "used"
  bitmap to know, and here the count of all-reduces per step is exactly the count of buckets.

Every collective is a ``dist.all_reduce`` looked up at call time, so `toolkit.comm` records it.

The seams a lab can leave to students, each a few lines with a reference to test against:
`assign_buckets` (which parameters share a bucket), `Bucket.pack` / `Bucket.unpack` (flat
buffer in and out), `BucketedDDP._finish` (reduce after backward) and
`OverlappedDDP._grad_ready` / `_launch_ready` / `_finish` (launch during backward, in order,
then wait). `NaiveDDP` is the reference they are checked against.

`BucketedDDP.register_comm_hook(state, hook)` replaces each bucket's all-reduce by a DDP
communication hook with torch's signature (``hook(state, bucket) -> Future`` of the averaged
flat buffer; the bucket is a `HookBucket`), e.g. `toolkit.data_parallel.powersgd.powersgd_hook`.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd import Variable

from .buckets import DEFAULT_BUCKET_CAP_MB, Bucket, HookBucket, assign_buckets, bucket_cap_bytes

__all__ = ["BucketedDDP", "NaiveDDP", "OverlappedDDP", "broadcast_module"]


def broadcast_module(module: nn.Module, *, src: int = 0, group: Any = None) -> None:
    """Overwrite every parameter and buffer with rank ``src``'s copy (one broadcast each)."""
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(t.data, src=src, group=group)


class _DataParallel(nn.Module):
    """What the three share: wrapping, broadcast, ``no_sync``, and the end-of-backward hook.

    A subclass says what to do when one parameter's gradient is ready (`_grad_ready`, optional)
    and how to reduce everything at the end of backward (`_finish`).
    """

    def __init__(self, module: nn.Module, *, process_group: Any = None,
                 broadcast: bool = True) -> None:
        super().__init__()
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(f"{type(self).__name__} needs an initialised process group "
                               "(start ranks with toolkit.launch.spawn or torchrun)")
        if not isinstance(module, nn.Module):
            raise TypeError(f"{type(self).__name__}(module=...) must be an nn.Module, "
                            f"got {type(module).__name__}")
        self.module = module
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.require_backward_grad_sync = True
        """Set to False (or use `no_sync()`) to let gradients accumulate locally."""
        # parameters() deduplicates tied tensors; frozen ones are never reduced.
        self.sync_params = [p for p in module.parameters() if p.requires_grad]
        if broadcast:
            src = 0 if process_group is None else dist.get_global_rank(process_group, 0)
            broadcast_module(module, src=src, group=process_group)
        self._sync_this_backward = True
        self._callback_queued = False
        for p in self.sync_params:
            p.register_post_accumulate_grad_hook(self._on_grad_ready)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        # PyTorch decides at forward time whether the coming backward synchronises.
        self._sync_this_backward = self.require_backward_grad_sync
        return self.module(*args, **kwargs)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Inside, forward+backward only accumulate gradients locally; no communication."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def _on_grad_ready(self, param: nn.Parameter) -> None:
        if not self._sync_this_backward:
            return
        if not self._callback_queued:
            self._callback_queued = True
            Variable._execution_engine.queue_callback(self._end_of_backward)
        self._grad_ready(param)

    def _end_of_backward(self) -> None:
        self._callback_queued = False
        self._finish()

    def _grad_ready(self, param: nn.Parameter) -> None:
        """Called once per parameter per backward, as soon as its ``.grad`` is final."""

    def _finish(self) -> None:
        raise NotImplementedError

    def _all_reduce_mean(self, t: torch.Tensor, *, async_op: bool = False) -> Any:
        # Divide before summing: the same result as sum-then-divide, and it lets the
        # overlapped version have nothing left to do after wait() but copy out.
        t.div_(self.world_size)
        return dist.all_reduce(t, group=self.process_group, async_op=async_op)


class NaiveDDP(_DataParallel):
    """After backward, all-reduce every parameter's gradient on its own and average it.

    The reference the other two are checked against: one all-reduce per parameter, so it pays
    the per-message latency α once per tensor, and nothing overlaps with backward.
    """

    def _finish(self) -> None:
        for p in self.sync_params:
            if p.grad is None:  # no gradient this step: contribute zeros (see module docstring)
                p.grad = torch.zeros_like(p)
            self._all_reduce_mean(p.grad)


class BucketedDDP(_DataParallel):
    """After backward, pack gradients into flat buckets of ``bucket_cap_mb`` and all-reduce each.

    Fewer, bigger messages: k buckets cost k·α instead of one α per parameter, for the same
    bytes. Buckets follow reverse parameter order (`assign_buckets`); ``self.buckets`` lists them.
    """

    def __init__(self, module: nn.Module, *, bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB,
                 process_group: Any = None, broadcast: bool = True) -> None:
        super().__init__(module, process_group=process_group, broadcast=broadcast)
        self.bucket_cap_mb = bucket_cap_mb
        groups = assign_buckets(self.sync_params, bucket_cap_bytes(bucket_cap_mb))
        self.buckets = [Bucket(i, [self.sync_params[j] for j in g]) for i, g in enumerate(groups)]
        self._bucket_of = {id(p): b for b in self.buckets for p in b.params}
        self._comm_hook: tuple[Any, Any] | None = None

    def register_comm_hook(self, state: Any, hook: Any) -> None:
        """Reduce every bucket with ``hook(state, bucket)`` instead of an all-reduce of its
        mean, as ``torch.nn.parallel.DistributedDataParallel.register_comm_hook`` does: the
        hook gets a `HookBucket` and returns a future whose value is the flat buffer of
        *averaged* gradients. Register once, before the first backward."""
        if not callable(hook):
            raise TypeError(f"register_comm_hook(hook=...) must be callable, got "
                            f"{type(hook).__name__}")
        if self._comm_hook is not None:
            raise RuntimeError("register_comm_hook: a hook is already registered (once only)")
        self._comm_hook = (state, hook)

    def _reduce(self, bucket: Bucket, *, async_op: bool) -> Any:
        """Start the reduction of one packed bucket: a handle with ``wait()``, or None when a
        plain synchronous all-reduce has already finished it."""
        if self._comm_hook is None:
            return self._all_reduce_mean(bucket.buffer, async_op=async_op)
        state, hook = self._comm_hook
        return hook(state, HookBucket(bucket, is_last=bucket.index == len(self.buckets) - 1))

    def _collect(self, bucket: Bucket, handle: Any) -> None:
        """Wait for a bucket's reduction and copy its averaged gradients out."""
        result = None if handle is None else handle.wait()
        if self._comm_hook is not None:   # a hook's future holds the reduced flat buffer
            value = result[0] if isinstance(result, (list, tuple)) else result
            if value.data_ptr() != bucket.buffer.data_ptr():
                bucket.buffer.copy_(value)
        bucket.unpack()

    def _finish(self) -> None:
        for bucket in self.buckets:
            bucket.pack_missing()                  # copy every .grad (or zeros) in
            # one message for the whole bucket, then averaged gradients back out
            self._collect(bucket, self._reduce(bucket, async_op=False))


class OverlappedDDP(BucketedDDP):
    """`BucketedDDP` whose all-reduces run *during* backward, overlapping with computation.

    Each parameter's post-accumulate-grad hook copies its gradient into its bucket; when a
    bucket has all its gradients, its all-reduce starts asynchronously (``async_op=True``) while
    autograd goes on computing earlier layers. Buckets are launched strictly in index order on
    every rank (a ready bucket waits for earlier ones): collectives on one process group must
    be issued in the same order everywhere, and a parameter unused on one rank only would
    otherwise reorder them. At the end of backward, buckets still waiting (they hold a
    parameter that got no gradient) are launched with zeros, then every handle is waited for
    and the averaged gradients are copied out, before ``backward()`` returns.
    """

    def __init__(self, module: nn.Module, *, bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB,
                 process_group: Any = None, broadcast: bool = True) -> None:
        super().__init__(module, bucket_cap_mb=bucket_cap_mb, process_group=process_group,
                         broadcast=broadcast)
        self._next_launch = 0  # index of the first bucket not yet launched in this backward

    def _launch_ready(self) -> None:
        while self._next_launch < len(self.buckets):
            bucket = self.buckets[self._next_launch]
            if bucket.pending:
                return
            bucket.work = self._reduce(bucket, async_op=True)
            self._next_launch += 1

    def _grad_ready(self, param: nn.Parameter) -> None:
        self._bucket_of[id(param)].pack(param)
        self._launch_ready()

    def _finish(self) -> None:
        for bucket in self.buckets[self._next_launch:]:
            bucket.pack_missing()   # parameters without a gradient this step: zeros
        self._launch_ready()
        for bucket in self.buckets:
            self._collect(bucket, bucket.work)
        self._next_launch = 0
