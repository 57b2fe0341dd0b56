"""An optimizer whose states live off the device, in a `Store`, and stream through the device
chunk by chunk during the step.

ZeRO-Offload (Ren et al., USENIX ATC 2021, §3) and ZeRO-Infinity (Rajbhandari et al., SC 2021,
§5) keep the K·Ψ bytes of optimizer state (K = 12 for mixed-precision Adam: fp32 master weights,
momentum and variance; ZeRO §3.1) out of GPU memory. Here the wrapped optimizer's tensor states
for Ψ parameters are cut into chunks of at most C elements (a chunk never spans two parameters),
and for each chunk k of n_k elements a step does

    read    its states from the store into a device buffer     s·n_k bytes in  (tier → device)
    update  the chunk with the wrapped optimizer                on the device
    write   its states back                                     s·n_k bytes out (device → tier)

with s the bytes of state per element: 8 for fp32 Adam (exp_avg, exp_avg_sq), 4 for SGD with
momentum, 0 for plain SGD. So a step moves s·Ψ bytes each way; the first moves nothing in, since
the optimizer creates its states then. `master_weights=True` keeps the fp32 master weights in the
store too (4 more bytes each way per element) and the model's parameters in their own, lower
precision: ZeRO-Offload's split of fp16 parameters on the GPU and fp32 copies on the CPU. The
device holds two chunks of states at most, 2·s·C bytes, whatever Ψ is.

With `prefetch=True` one I/O thread reads chunk k+1 while the main thread updates chunk k, and
writes chunk k back while chunk k+1 is updated: two buffer slots, and the thread's first-in
first-out order writes chunk k−1 before it reads chunk k+1 into the same slot. A step then
takes about max(Σ reads + writes, Σ updates) instead of their sum (`toolkit.cost.offload`
simulates both); ZeRO-Infinity's "overlap-centric design" (§6) overlaps the same transfers.
On a GPU the thread copies on a stream of its own and waits for the update's event before it
writes a chunk back.

The update is the wrapped torch optimizer itself, stepped on a *window* (an ``nn.Parameter``
viewing the chunk) with the chunk's states swapped into its state dict. For element-wise
optimizers (SGD, Adam, AdamW) that gives the bits of one in-memory step (tests/test_offload.py);
not for those that look at a whole tensor (LAMB, Adafactor) or the global gradient norm.

    opt = OffloadOptimizer(model.parameters(), torch.optim.Adam, tier="nvme", lr=1e-3)
    loss.backward(); opt.step(); opt.last_step.bytes_read; opt.close()
    ShardedOptimizer(model.parameters(), offloaded(torch.optim.Adam, tier="cpu"), stage=2)
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
from torch import Tensor, nn

from ..arguments import check_int
from ..cost.offload import Span
from .state_dict import group_options, is_tensor_state, pack, unpack
from .store import Store, make_store

MASTER = "master"
"""Store name of the fp32 master weights (with ``master_weights=True``)."""


@dataclass(frozen=True)
class StepStats:
    """What one `step` moved and how long it took."""

    bytes_read: int
    """Bytes copied from the store to the device."""
    bytes_written: int
    """Bytes copied from the device to the store."""
    seconds: float
    """Wall time of the step (all writes finished)."""
    chunks: int
    """Chunks updated (those whose parameter had a gradient)."""
    spans: list[Span] = field(repr=False)


@dataclass
class _Chunk:
    param: nn.Parameter
    group: int
    lo: int
    hi: int
    offset: int                                  # first element in the store's flat tensors
    window: nn.Parameter
    inner: torch.optim.Optimizer
    resident: dict[str, Any] = field(default_factory=dict)  # scalar states (Adam's step)
    started: bool = False                        # its states exist in the store

    @property
    def numel(self) -> int:
        return self.hi - self.lo


class OffloadOptimizer(torch.optim.Optimizer):
    """`optimizer_class`'s update with its tensor states kept in a store (module docstring).

    ``tier`` "nvme" (a memory-mapped file in a temporary folder under `folder`) or "cpu" (host
    memory, pinned when the parameters are on a GPU), or pass a ready `store`. ``chunk_numel``
    elements per chunk at most; ``prefetch`` overlaps reads and writes with updates;
    ``master_weights`` keeps fp32 master weights in the store; ``cold`` makes the file tier
    read from the disk (`FileStore`). `defaults` go to `optimizer_class`. `last_step` holds
    the bytes and spans of the latest step. Call `close()` (or use ``with``) to free the tier.
    """

    def __init__(self, params: Iterable[Any], optimizer_class: type[torch.optim.Optimizer], *,
                 tier: str = "nvme", store: Store | None = None, chunk_numel: int = 1 << 20,
                 prefetch: bool = True, master_weights: bool = False,
                 folder: str | os.PathLike | None = None, cold: bool = False,
                 **defaults: Any) -> None:
        if not (isinstance(optimizer_class, type)
                and issubclass(optimizer_class, torch.optim.Optimizer)):
            raise TypeError(f"OffloadOptimizer: optimizer_class must be a torch.optim.Optimizer "
                            f"class (e.g. torch.optim.Adam), got {optimizer_class!r}")
        check_int("OffloadOptimizer", "chunk_numel", chunk_numel)
        super().__init__(params, defaults)
        trainable = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        kinds = {(p.dtype, p.device) for p in trainable}
        if len(kinds) > 1:
            raise ValueError(f"OffloadOptimizer: all trainable parameters must share one dtype "
                             f"and device (one store per kind), got {sorted(map(str, kinds))}")
        if any(not p.is_contiguous() for p in trainable):
            raise ValueError("OffloadOptimizer: parameters must be contiguous (chunks are "
                             "views of p.view(-1))")
        self.device = trainable[0].device if trainable else torch.device("cpu")
        self.prefetch, self.master_weights = prefetch, master_weights
        self.store = store if store is not None else make_store(
            tier, folder=folder, pin=self.device.type == "cuda", cold=cold)
        self.numel = sum(p.numel() for p in trainable)
        self.chunks: list[_Chunk] = []
        self.layout: dict[str, torch.dtype] = {MASTER: torch.float32} if master_weights else {}
        # name → dtype of each tensor kept in the store (the states are known after a step)
        if master_weights:
            self.store.allocate(MASTER, self.numel, torch.float32)
        offset = 0
        for g, group in enumerate(self.param_groups):
            for p in (p for p in group["params"] if p.requires_grad):
                for lo in range(0, p.numel(), chunk_numel):
                    hi = min(lo + chunk_numel, p.numel())
                    self.chunks.append(self._chunk(optimizer_class, g, p, lo, hi, offset + lo))
                offset += p.numel()
        self.chunk_numel = max((c.numel for c in self.chunks), default=0)
        self._slots: list[dict[str, Tensor]] = [{}, {}] if prefetch else [{}]
        self._pending: dict[int, dict[str, Tensor]] = {}
        self._io: ThreadPoolExecutor | None = None
        self._io_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.last_step: StepStats | None = None

    def _chunk(self, optimizer_class: type[torch.optim.Optimizer], g: int, p: nn.Parameter,
               lo: int, hi: int, offset: int) -> _Chunk:
        flat = p.detach().view(-1)[lo:hi]
        if self.master_weights:  # the window will view the master copy read into a slot
            self.store.write(MASTER, offset, offset + hi - lo, flat.float())
            window = nn.Parameter(torch.empty(0, dtype=torch.float32, device=p.device))
        else:
            window = nn.Parameter(flat)  # shares the parameter's storage: updates land in it
        inner = optimizer_class([{"params": [window], **group_options(self.param_groups[g])}])
        return _Chunk(p, g, lo, hi, offset, window, inner)

    @property
    def device_bytes(self) -> int:
        """Bytes of state buffers on the device (two chunk slots, one without prefetch)."""
        return sum(t.numel() * t.element_size() for slot in self._slots for t in slot.values())

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        """Read, update and write back every chunk whose parameter has a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        todo = [k for k, c in enumerate(self.chunks) if c.param.grad is not None]
        for slot in self._slots:  # buffers for every state known so far, made once
            for name, dtype in self.layout.items():
                if name not in slot:
                    slot[name] = torch.empty(self.chunk_numel, dtype=dtype, device=self.device)
        read0, written0 = self.store.bytes_read, self.store.bytes_written
        spans: list[Span] = []
        start = time.perf_counter()
        if self.prefetch and len(todo) > 1:
            self._overlapped(todo, spans)
        else:
            for k in todo:
                self._read(k, self._reads(k), 0, spans, "main")
                self._update(k, 0, spans)
                self._write(k, spans, "main", None)
        self.last_step = StepStats(self.store.bytes_read - read0,
                                   self.store.bytes_written - written0,
                                   time.perf_counter() - start, len(todo), spans)
        return loss

    def _overlapped(self, todo: list[int], spans: list[Span]) -> None:
        if self._io is None:
            self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="offload-io")
        first = todo[0]
        reads = {first: self._io.submit(self._read, first, self._reads(first), 0, spans, "io")}
        writes = []
        for i, k in enumerate(todo):
            if i + 1 < len(todo):  # queued after chunk i-1's write, which used the same slot
                nxt = todo[i + 1]
                reads[nxt] = self._io.submit(self._read, nxt, self._reads(nxt), (i + 1) % 2,
                                             spans, "io")
            waited = time.perf_counter()
            reads.pop(k).result()
            spans.append(Span("main", "wait", k, waited, time.perf_counter()))
            self._update(k, i % 2, spans)
            writes.append(self._io.submit(self._write, k, spans, "io", self._event()))
        for w in writes:
            w.result()

    def _event(self) -> torch.cuda.Event | None:
        """An event after the update's kernels, for the I/O stream to wait on (GPU only)."""
        if self._io_stream is None:
            return None
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return event

    def _stream(self, lane: str) -> contextlib.AbstractContextManager:
        if self._io_stream is None or lane != "io":
            return contextlib.nullcontext()
        return torch.cuda.stream(self._io_stream)

    def _reads(self, k: int) -> list[str]:
        """What chunk k reads, decided on the main thread (which alone changes the layout)."""
        return [n for n in self.layout if self.chunks[k].started or n == MASTER]

    def _read(self, k: int, names: list[str], slot: int, spans: list[Span], lane: str) -> None:
        c, start = self.chunks[k], time.perf_counter()
        with self._stream(lane):
            for name in names:
                out = self._slots[slot][name][:c.numel]
                self.store.read(name, c.offset, c.offset + c.numel, out)
        spans.append(Span(lane, "read", k, start, time.perf_counter()))

    def _update(self, k: int, slot: int, spans: list[Span]) -> None:
        c, start = self.chunks[k], time.perf_counter()
        grad = c.param.grad.reshape(-1)[c.lo:c.hi]
        if self.master_weights:
            c.window.data = self._slots[slot][MASTER][:c.numel]
            c.window.grad = grad.to(torch.float32)
        else:
            c.window.grad = grad
        if c.started:
            c.inner.state[c.window] = {**c.resident, **{n: self._slots[slot][n][:c.numel]
                                                        for n in self.layout if n != MASTER}}
        c.inner.param_groups[0].update(group_options(self.param_groups[c.group]))
        c.inner.step()
        state = c.inner.state.pop(c.window, {})
        out = {n: v for n, v in state.items() if is_tensor_state(n, v, c.window)}
        c.resident = {n: v for n, v in state.items() if n not in out}
        if not c.started:
            for name, value in out.items():
                self.layout.setdefault(name, value.dtype)
                self.store.allocate(name, self.numel, value.dtype)
            c.started = True
        if self.master_weights:
            c.param.view(-1)[c.lo:c.hi].copy_(c.window)  # the device's low-precision copy
            out[MASTER] = c.window.detach()
        c.window.grad = None
        self._pending[k] = out
        spans.append(Span("main", "update", k, start, time.perf_counter()))

    def _write(self, k: int, spans: list[Span], lane: str, event: Any) -> None:
        c, start = self.chunks[k], time.perf_counter()
        with self._stream(lane):
            if event is not None:
                torch.cuda.current_stream(self.device).wait_event(event)
            for name, value in self._pending.pop(k).items():
                self.store.write(name, c.offset, c.offset + c.numel, value)
        spans.append(Span(lane, "write", k, start, time.perf_counter()))

    def state_dict(self) -> dict[str, Any]:
        """torch's format, each state read back whole from the store (`state_dict.pack`):
        loadable by the wrapped optimizer class itself."""
        return pack(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load ours, or the wrapped class's own on the same parameters (`state_dict.unpack`)."""
        unpack(self, state_dict)

    def close(self) -> None:
        """Stop the I/O thread and free the store (files removed)."""
        if self._io is not None:
            self._io.shutdown(wait=True)
            self._io = None
        self.store.close()

    def __enter__(self) -> OffloadOptimizer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def offloaded(optimizer_class: type[torch.optim.Optimizer], **options: Any
              ) -> Callable[..., OffloadOptimizer]:
    """`optimizer_class` offloaded, as a class-like factory for `ShardedOptimizer`: each rank's
    shard gets an `OffloadOptimizer` with `options` (tier, chunk_numel, prefetch, ...)."""
    return functools.partial(OffloadOptimizer, optimizer_class=optimizer_class, **options)


__all__ = ["MASTER", "OffloadOptimizer", "Span", "StepStats", "offloaded"]
