"""PowerSGD: all-reduce a rank-r approximation of the gradient instead of the gradient.

Vogels, Karimireddy & Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for
Distributed Optimization", NeurIPS 2019. A layer's gradient reshaped to a matrix M (n × m:
rows = first dimension, columns = the rest) is replaced by P̂·Qᵀ with P̂ (n × r), Q (m × r).
Algorithm 1 (one step of subspace iteration, warm-started from the previous step's Q)::

    P ← M·Q                 (n × m)(m × r) → (n × r)
    P ← all-reduce mean(P)
    P̂ ← orthogonalise(P)    (Gram–Schmidt on the r columns)
    Q ← Mᵀ·P̂                (m × n)(n × r) → (m × r)
    Q ← all-reduce mean(Q)
    decompress: M ≈ P̂·Qᵀ

Because P and Q are linear in M, the two means make P̂·Qᵀ a rank-r approximation of the
*mean* gradient (not a mean of compressed gradients), the same on every rank, and all-reduce
(not all-gather) carries it: r·(n + m) elements per matrix instead of n·m
(`toolkit.cost.traffic.powersgd_elements`). Algorithm 2 adds error feedback: each rank adds
the error it was left with last step to its gradient before compressing, and keeps
eᵢ ← (gradient + eᵢ) − decompressed mean (what it put in minus what was applied, as torch's
powerSGD_hook does); the momentum of Algorithm 2 is the optimizer's (SGD with momentum).

Vectors (biases, LayerNorm) and matrices where r·(n + m)·`min_compression_rate` ≥ n·m are
all-reduced uncompressed, the rule of torch's ``PowerSGDState`` (default rate 2).

`powersgd_hook(state, bucket)` has the signature of a DDP communication hook: register it
with ``torch.nn.parallel.DistributedDataParallel.register_comm_hook(state, powersgd_hook)``
or with the course's `BucketedDDP` / `OverlappedDDP` ``register_comm_hook``. Every collective
it makes is issued and waited for in the thread that calls the hook, so in the same order on
every rank, and it returns a completed future. torch's own ``powerSGD_hook`` issues its second
and third all-reduce from inside future callbacks: on gloo those run on the process group's
worker threads when the previous all-reduce completes, so with several buckets the ranks
issue their all-reduces in different orders: gloo pairs them by order, and a rank hangs or aborts
(`Received data size doesn't match expected size`, lesson 15). `in_order(hook)`
runs any hook to completion before returning, which makes torch's usable on gloo.
`power_step` is Algorithm 1 in one process (no all-reduce), for looking at the error.

Shapes: the bucket's flat buffer (N,) is the concatenation of its gradients in order; state
(errors (N,), Q per matrix (m × r)) lives on the buffer's device.
"""

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import Tensor

from ..arguments import check_int, check_positive
from ..cost.traffic import compresses

__all__ = ["PowerSGDState", "completed", "in_order", "orthogonalize", "power_step",
           "powersgd_hook"]


def orthogonalize(p: Tensor, *, epsilon: float = 1e-8) -> Tensor:
    """Gram–Schmidt on the columns of ``p`` (n × r), in place; returns ``p``. ``epsilon`` keeps
    an all-zero column at zero instead of dividing by 0."""
    for i in range(p.shape[1]):
        col = p[:, i]
        col.div_(col.norm() + epsilon)
        if i + 1 < p.shape[1]:
            rest = p[:, i + 1:]
            rest.sub_(col[:, None] * (col @ rest)[None, :])   # remove the component along col
    return p


def power_step(matrix: Tensor, q: Tensor, *, epsilon: float = 1e-8) -> tuple[Tensor, Tensor]:
    """One step of Algorithm 1 without the all-reduces: P̂ = orthogonalise(M·Q), Q' = Mᵀ·P̂.
    ``matrix`` (n × m), ``q`` (m × r); returns (P̂ (n × r), Q' (m × r)), and M ≈ P̂·Q'ᵀ."""
    if matrix.dim() != 2 or q.dim() != 2 or q.shape[0] != matrix.shape[1]:
        raise ValueError(f"power_step: need matrix (n × m) and q (m × r), got "
                         f"{tuple(matrix.shape)} and {tuple(q.shape)}")
    p = orthogonalize(matrix @ q, epsilon=epsilon)     # (n × m)(m × r) → (n × r)
    return p, matrix.t() @ p                           # (m × n)(n × r) → (m × r)


@dataclass
class PowerSGDState:
    """Settings and per-bucket memory of `powersgd_hook` (one per DDP model)."""

    matrix_rank: int = 1
    """r, the rank of the approximation."""
    process_group: Any = None
    """The group to all-reduce over (None: the default group)."""
    start_iter: int = 0
    """Backward passes with plain all-reduce before compressing (torch's
    ``start_powerSGD_iter``; torch's DDP rebuilds its buckets after the first one)."""
    min_compression_rate: float = 2.0
    """Compress a matrix only if r·(n + m)·rate < n·m."""
    warm_start: bool = True
    """Start each step's power iteration from the previous step's Q (Algorithm 1)."""
    error_feedback: bool = True
    """Add last step's compression error to the gradient (Algorithm 2)."""
    seed: int = 0
    """Seed of the random first Q, the same on every rank."""
    epsilon: float = 1e-8
    """Added to column norms in `orthogonalize`."""
    iter: int = 0
    """Backward passes seen so far."""
    errors: dict = field(default_factory=dict, repr=False)
    qs: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        check_int("PowerSGDState", "matrix_rank", self.matrix_rank)
        check_int("PowerSGDState", "start_iter", self.start_iter, low=0)
        check_positive("PowerSGDState", "min_compression_rate", self.min_compression_rate)

    def initial_q(self, m: int, r: int, *, step: int, position: int, like: Tensor) -> Tensor:
        """The random Q (m × r) a power iteration starts from without a warm start: drawn from
        (``seed``, ``step``, the matrix's ``position`` among its bucket's compressed matrices),
        on ``like``'s device and dtype, so the same on every rank of one kind of device."""
        gen = torch.Generator(device=like.device)
        gen.manual_seed(self.seed * 1_000_003 + step * 1_009 + position)
        return torch.randn(m, r, generator=gen, device=like.device, dtype=like.dtype)


def completed(value: Tensor) -> torch.futures.Future[torch.Tensor]:
    """A future that already holds ``value``: what a hook returns once its collectives have
    finished on the calling thread."""
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(value)
    return fut


def powersgd_hook(state: PowerSGDState,
                  bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """A DDP communication hook: average ``bucket``'s gradients through PowerSGD.

    ``bucket`` is torch's ``dist.GradBucket`` or the course's `HookBucket`: ``buffer()``,
    ``gradients()``, ``index()``, ``is_last()``. Returns a future whose value is the buffer,
    holding the (approximated) mean gradient.
    """
    group = state.process_group
    world = dist.get_world_size(group)
    buffer = bucket.buffer()
    shapes = [tuple(g.shape) for g in bucket.gradients()]
    if sum(torch.Size(s).numel() for s in shapes) != buffer.numel():
        raise ValueError("powersgd_hook: the bucket's gradients do not tile its buffer")
    # Keyed by index *and* layout: torch's DDP may rebuild its buckets after the first step.
    key = (bucket.index(), tuple(shapes))
    step = state.iter
    if bucket.is_last():       # the step count moves once per backward, after its last bucket
        state.iter += 1
    if step < state.start_iter:   # plain all-reduce for the first start_iter steps
        buffer.div_(world)
        dist.all_reduce(buffer, group=group)
        return completed(buffer)

    if state.error_feedback:
        if key not in state.errors:
            state.errors[key] = torch.zeros_like(buffer)
        buffer.add_(state.errors[key])            # gradient + eᵢ
        before = buffer.clone()

    # Each gradient's slice of the buffer, as a matrix (n × m) or left flat.
    matrices, vectors, offset = [], [], 0
    for shape in shapes:
        numel = torch.Size(shape).numel()
        piece = buffer[offset: offset + numel]
        n = shape[0] if shape else 1
        m = numel // n if n else 0
        if len(shape) >= 2 and compresses(n, m, state.matrix_rank,
                                          min_compression_rate=state.min_compression_rate):
            matrices.append(piece.view(n, m))
        else:
            vectors.append(piece)
        offset += numel

    # 1. The uncompressed tensors: one flat all-reduce, started first.
    flat = torch.cat(vectors) if vectors else None
    work_flat = None
    if flat is not None:
        flat.div_(world)
        work_flat = dist.all_reduce(flat, group=group, async_op=True)
    # 2. P = M·Q for every matrix, all-reduced as one vector (this rank waits: Q needs it).
    qs = state.qs.get(key) if state.warm_start else None
    if qs is None:
        qs = [state.initial_q(mat.shape[1], min(state.matrix_rank, *mat.shape), step=step,
                              position=i, like=buffer) for i, mat in enumerate(matrices)]
    ps = [mat @ q for mat, q in zip(matrices, qs)]                 # (n × m)(m × r) → (n × r)
    if ps:
        p_flat = torch.cat([p.reshape(-1) for p in ps]).div_(world)
        dist.all_reduce(p_flat, group=group)
        ps = _split(p_flat, [p.shape for p in ps])
    # 3. Q = Mᵀ·P̂, all-reduced as one vector, asynchronously.
    ps = [orthogonalize(p, epsilon=state.epsilon) for p in ps]
    qs = [mat.t() @ p for mat, p in zip(matrices, ps)]           # (m × n)(n × r) → (m × r)
    if qs:
        q_flat = torch.cat([q.reshape(-1) for q in qs]).div_(world)
        dist.all_reduce(q_flat, group=group)
        qs = _split(q_flat, [q.shape for q in qs])
        for mat, p, q in zip(matrices, ps, qs):
            mat.copy_(p @ q.t())                                 # (n × r)(r × m) → (n × m)
        if state.warm_start:
            state.qs[key] = qs
    if work_flat is not None:
        work_flat.wait()
        start = 0
        for piece in vectors:
            piece.copy_(flat[start: start + piece.numel()])
            start += piece.numel()
    if state.error_feedback:
        state.errors[key] = before - buffer                      # what was put in − applied
    # Every collective was issued and waited for here, in this thread: the same order on every
    # rank. (A callback of the returned future must not wait on a gloo Work: it would run on
    # the process group's worker thread that completes that Work, and wait for itself.)
    return completed(buffer)


def _split(flat: Tensor, shapes: list[torch.Size]) -> list[Tensor]:
    out, start = [], 0
    for shape in shapes:
        numel = shape.numel()
        out.append(flat[start: start + numel].view(shape))
        start += numel
    return out


def in_order(hook: Callable[[Any, Any], torch.futures.Future]
             ) -> Callable[[Any, Any], torch.futures.Future]:
    """``hook`` run to completion inside the call: bucket k's collectives all finish before
    bucket k+1's hook starts, so every rank issues them in the same order (the workaround for
    torch's ``powerSGD_hook`` on gloo; it gives up overlapping one bucket with the next)."""
    def ordered(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        return completed(hook(state, bucket).wait())
    ordered.__name__ = f"in_order({getattr(hook, '__name__', 'hook')})"
    return ordered
