"""Gradient accumulation: k small backward passes that add up to one big one.

For a loss that is a mean over a batch of N items, L = (1/N) Σᵢ ℓᵢ, split the batch into k
micro-batches of n = N/k items with means L_j = (1/n) Σ_{i∈j} ℓᵢ. Then

    L = (1/k) Σ_j L_j      so      ∇L = Σ_j ∇(L_j / k).

``backward()`` *adds* into ``.grad``, so running backward on L_j / k for j = 1..k (without
zeroing in between) leaves exactly ∇L in ``.grad``: the gradient of one batch k× larger, while
only one micro-batch's activations are alive at a time. Without the 1/k the accumulated
gradient would be k× too big, which is the same as multiplying the learning rate by k.
When the micro-batches are not all the same size the weight of micro-batch j is n_j/N
(which is 1/k when they are equal); `accumulate_gradients` uses n_j/N, so it is exact either way.
(Caveat: layers that mix items of a batch, such as BatchNorm, see k small batches instead of one
big one; the models of this course have none.)

Under data parallelism the last micro-batch is where the ranks synchronise: the first k−1 run
inside ``ddp.no_sync()`` (no all-reduce), the k-th one all-reduces the accumulated sum once, so
communication is paid once per optimizer step, not once per micro-batch.

    opt.zero_grad()
    loss = accumulate_gradients(ddp_model, split_batch(x, y, micro_batches=4), mse)
    opt.step()
"""

from __future__ import annotations

import contextlib
from typing import Callable, Sequence

from torch import Tensor, nn

from ..arguments import check_int

__all__ = ["accumulate_gradients", "split_batch"]


def split_batch(*tensors: Tensor, micro_batches: int) -> list[tuple[Tensor, ...]]:
    """Cut tensors that share a first (batch) dimension into ``micro_batches`` pieces.

    Sizes follow `torch.tensor_split`: N items into k pieces, the first N mod k pieces one item
    longer. Returns one tuple per micro-batch, e.g. ``[(x0, y0), (x1, y1), ...]``.
    """
    check_int("split_batch", "micro_batches", micro_batches)
    if not tensors:
        raise ValueError("split_batch: pass at least one tensor")
    n = tensors[0].shape[0]
    if any(t.shape[0] != n for t in tensors):
        raise ValueError(f"split_batch: tensors must share their first dimension, got "
                         f"{[tuple(t.shape) for t in tensors]}")
    if micro_batches > n:
        raise ValueError(f"split_batch: micro_batches={micro_batches} is more than the "
                         f"{n} items of the batch")
    pieces = [t.tensor_split(micro_batches) for t in tensors]
    return [tuple(p[j] for p in pieces) for j in range(micro_batches)]


def accumulate_gradients(
    model: nn.Module,
    micro_batches: Sequence[tuple[Tensor, ...]],
    loss_fn: Callable[..., Tensor],
    *,
    sync_last_only: bool = True,
) -> Tensor:
    """Run forward+backward on each micro-batch, adding ``n_j/N · ∇L_j`` into ``.grad``.

    ``loss_fn(model, *micro_batch)`` must return the *mean* loss over that micro-batch; its
    first tensor's length is taken as the micro-batch size n_j. Gradients are added to whatever
    ``.grad`` already holds (call ``zero_grad()`` before, as for a single backward). If
    ``model`` has ``no_sync()`` (a DDP) and ``sync_last_only`` is True, every micro-batch but
    the last runs inside it, so the ranks all-reduce once.

    Returns the detached mean loss over all N items (what one big batch would have reported).
    """
    if len(micro_batches) == 0:
        raise ValueError("accumulate_gradients: micro_batches is empty")
    sizes = [int(mb[0].shape[0]) for mb in micro_batches]
    if min(sizes) < 1:
        raise ValueError(f"accumulate_gradients: every micro-batch needs >= 1 item, got {sizes}")
    total = sum(sizes)
    no_sync = getattr(model, "no_sync", None) if sync_last_only else None
    mean_loss: Tensor | None = None  # the first loss sets its device (and dtype)
    for j, (mb, n_j) in enumerate(zip(micro_batches, sizes)):
        last = j == len(micro_batches) - 1
        ctx = no_sync() if (no_sync is not None and not last) else contextlib.nullcontext()
        with ctx:
            # n_j / N == 1/k for equal micro-batches: see the module docstring for why.
            loss = loss_fn(model, *mb) * (n_j / total)
            loss.backward()
        mean_loss = loss.detach() if mean_loss is None else mean_loss + loss.detach()
    return mean_loss
