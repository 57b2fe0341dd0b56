"""Where offloaded tensors live: host memory (the CPU tier) or a memory-mapped file (the NVMe
tier), read into and written from device buffers slice by slice, every byte counted.

ZeRO-Offload (Ren et al., USENIX ATC 2021, §3) keeps the optimizer states in CPU memory;
ZeRO-Infinity (Rajbhandari et al., SC 2021, §5-6) also on NVMe, read and written in large
chunks through pinned buffers (its "infinity offload engine", DeepSpeed's aio library).
A `Store` holds named flat tensors (one per optimizer state: "exp_avg", "exp_avg_sq", ...) of
`numel` elements each and moves slices [lo, hi) between them and tensors on the device:

    read(name, lo, hi, out)    out ← store[name][lo:hi]     (hi − lo)·itemsize bytes in
    write(name, lo, hi, src)   store[name][lo:hi] ← src      (hi − lo)·itemsize bytes out

Both count what they move (`bytes_read`, `bytes_written`, and the largest single transfer,
`largest_transfer`: the device buffer a chunked step needs) and return only when the copy is
complete, also for a GPU copy issued with ``non_blocking`` on the caller's stream.

`HostStore` keeps a CPU tensor per name, pinned (page-locked) when `pin=True`: a GPU then copies
it by DMA, asynchronously, at PCIe speed; pageable memory is copied through a staging buffer by
the driver. Without a GPU nothing can be pinned: the host tier is then ordinary memory of the
same process, a *stand-in* for the far side of a PCIe link that saves no memory (the bytes and
the copies are real and counted all the same).

`FileStore` keeps a file per name in a private folder, mapped into memory (``mmap``,
MAP_SHARED) and seen as a tensor (``torch.frombuffer``, no copy). A read copies out of the page
cache, which the kernel fills from the disk on a miss; a write dirties pages that the kernel
writes back later. So a file that fits in free memory is served at memory speed: the page cache
is a tier of its own. ``cold=True`` writes every slice through to the disk (``msync``) and
evicts it (``madvise``/``fadvise`` DONTNEED), so the next read comes from the disk, as
DeepSpeed's O_DIRECT reads do. `close()` removes the folder (also at interpreter exit, but a
rank that ends with ``os._exit`` must call it).
"""

from __future__ import annotations

import mmap
import os
import shutil
import tempfile
import time
import weakref
from abc import ABC, abstractmethod

import torch
from torch import Tensor

from ..arguments import check_int
from ..launch.gpus import gpu_count

TIERS = ("cpu", "nvme")
"""The off-device tiers a store can be: host memory, or a file (NVMe)."""


def host_tensor(numel: int, dtype: torch.dtype, *, pin: bool = False,
                buffer: mmap.mmap | None = None) -> Tensor:
    """A flat tensor in host memory: over `buffer` (a file mapping, no copy) when given, else
    new memory, page-locked when `pin` (only possible with a GPU)."""
    if buffer is not None:
        return torch.frombuffer(buffer, dtype=dtype, count=numel)
    return torch.empty(numel, dtype=dtype, device="cpu", pin_memory=pin)


def _finish(*tensors: Tensor) -> None:
    """Wait for a copy just issued on the current stream (nothing to wait for on the CPU)."""
    for t in tensors:
        if t.device.type == "cuda":
            torch.cuda.current_stream(t.device).synchronize()
            return


class Store(ABC):
    """Named flat host tensors, read and written in slices with every byte counted."""

    tier = ""

    def __init__(self) -> None:
        self._tensors: dict[str, Tensor] = {}
        self.bytes_read = 0
        """Bytes copied out of the store since it was made (all `read` calls)."""
        self.bytes_written = 0
        """Bytes copied into the store since it was made (all `write` calls)."""
        self.largest_transfer = 0
        """Bytes of the largest single `read` or `write` so far."""

    def allocate(self, name: str, numel: int, dtype: torch.dtype) -> None:
        """Make room for the tensor `name` (no-op when it exists with this size and dtype)."""
        check_int(f"{type(self).__name__}.allocate", "numel", numel)
        held = self._tensors.get(name)
        if held is not None:
            if (held.numel(), held.dtype) != (numel, dtype):
                raise ValueError(f"{type(self).__name__}: {name!r} holds {held.numel()} "
                                 f"{held.dtype}, asked for {numel} {dtype}")
            return
        self._tensors[name] = self._make(name, numel, dtype)

    @abstractmethod
    def _make(self, name: str, numel: int, dtype: torch.dtype) -> Tensor:
        """A new flat tensor of `numel` elements in this tier's memory."""

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    @property
    def names(self) -> list[str]:
        return list(self._tensors)

    @property
    def nbytes(self) -> int:
        """Bytes held in this tier (every tensor allocated so far)."""
        return sum(t.numel() * t.element_size() for t in self._tensors.values())

    def read(self, name: str, lo: int, hi: int, out: Tensor) -> None:
        """``out ← store[name][lo:hi]`` (out has hi − lo elements, on any device)."""
        src = self._tensors[name][lo:hi]
        out.copy_(src, non_blocking=out.device.type == "cuda")
        _finish(out)
        nbytes = src.numel() * src.element_size()
        self.bytes_read += nbytes
        self.largest_transfer = max(self.largest_transfer, nbytes)

    def write(self, name: str, lo: int, hi: int, src: Tensor) -> None:
        """``store[name][lo:hi] ← src`` (src has hi − lo elements, on any device)."""
        dst = self._tensors[name][lo:hi]
        dst.copy_(src, non_blocking=src.device.type == "cuda")
        _finish(src)
        nbytes = dst.numel() * dst.element_size()
        self.bytes_written += nbytes
        self.largest_transfer = max(self.largest_transfer, nbytes)
        self._written(name, lo, hi)

    def _written(self, name: str, lo: int, hi: int) -> None:  # noqa: B027 (a hook, default: none)
        """Hook after a write (the cold file store sends it to the disk)."""

    def close(self) -> None:
        """Free the tier's memory (and files)."""
        self._tensors.clear()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.tier}, {self.nbytes:,} bytes in {self.names})"


class HostStore(Store):
    """The CPU tier: one host tensor per name, page-locked when `pin` (module docstring)."""

    tier = "cpu"

    def __init__(self, *, pin: bool = False) -> None:
        super().__init__()
        if pin and gpu_count() == 0:
            raise ValueError("HostStore: pin=True needs a GPU (page-locked memory exists for "
                             "DMA by a device); use pin=False on a CPU-only machine")
        self.pin = pin

    def _make(self, name: str, numel: int, dtype: torch.dtype) -> Tensor:
        return host_tensor(numel, dtype, pin=self.pin)


class FileStore(Store):
    """The NVMe tier: one memory-mapped file per name in a private folder under `folder`
    (default: the system's temporary folder); `cold` evicts every written slice from the page
    cache so that reads come from the disk (module docstring)."""

    tier = "nvme"

    def __init__(self, folder: str | os.PathLike | None = None, *, cold: bool = False) -> None:
        super().__init__()
        self.folder = tempfile.mkdtemp(prefix="offload-", dir=folder)
        self.cold = cold
        self._files: dict[str, tuple[int, mmap.mmap]] = {}
        # Removes the folder if close() is never called (at collection or interpreter exit).
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.folder, ignore_errors=True)

    def path(self, name: str) -> str:
        return os.path.join(self.folder, f"{name}.bin")

    def _make(self, name: str, numel: int, dtype: torch.dtype) -> Tensor:
        nbytes = numel * dtype.itemsize
        fd = os.open(self.path(name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.ftruncate(fd, nbytes)  # a sparse file: the disk fills as slices are first written
        mapping = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._files[name] = (fd, mapping)
        return host_tensor(numel, dtype, buffer=mapping)

    def file_bytes(self) -> dict[str, int]:
        """Each file's size on the file system, bytes (what the NVMe tier holds)."""
        return {name: os.fstat(fd).st_size for name, (fd, _) in self._files.items()}

    def _written(self, name: str, lo: int, hi: int) -> None:
        if not self.cold:
            return
        fd, mapping = self._files[name]
        size = self._tensors[name].element_size()
        page = mmap.PAGESIZE
        a = lo * size // page * page                       # msync and madvise take whole pages
        b = min(len(mapping), -(-hi * size // page) * page)
        # To the disk now: fdatasync, not mmap.flush (msync), which holds the GIL while it waits
        # and would stall the thread that updates. Linux writes back the pages dirtied through
        # the mapping too, and only this slice's are dirty (every write is flushed).
        os.fdatasync(fd)
        mapping.madvise(mmap.MADV_DONTNEED, a, b - a)      # unmap the pages from this process
        os.posix_fadvise(fd, a, b - a, os.POSIX_FADV_DONTNEED)  # and evict them, now clean

    def close(self) -> None:
        self._tensors.clear()  # the tensors' buffer exports end here, so the maps can close
        for fd, mapping in self._files.values():
            try:
                mapping.close()
            except BufferError:  # a tensor over the map is still referenced: unmapped at exit
                pass
            os.close(fd)
        self._files.clear()
        self._cleanup()


class ThrottledStore(Store):
    """Another store behind an emulated link: every read or write of n bytes takes at least
    `latency` + n / `bandwidth` seconds, the rest of it slept. Sleeping leaves the CPU to the
    thread that updates, as a copy engine (DMA) or a disk does on a real machine, so the overlap
    of a prefetching step shows on any CPU however loaded (as `toolkit.pipeline.Delay` does for
    pipeline stages). The bytes, the memory and the files are `inner`'s."""

    def __init__(self, inner: Store, *, latency: float, bandwidth: float) -> None:
        super().__init__()
        if not (latency >= 0 and bandwidth > 0):
            raise ValueError(f"ThrottledStore: need latency >= 0 s and bandwidth > 0 bytes/s, "
                             f"got latency={latency!r}, bandwidth={bandwidth!r}")
        self.inner, self.latency, self.bandwidth = inner, latency, bandwidth
        self.tier = inner.tier
        self._tensors = inner._tensors  # one set of tensors: allocated, read and freed by inner

    def _make(self, name: str, numel: int, dtype: torch.dtype) -> Tensor:
        return self.inner._make(name, numel, dtype)

    def _wait(self, start: float, nbytes: int) -> None:
        left = start + self.latency + nbytes / self.bandwidth - time.perf_counter()
        if left > 0:
            time.sleep(left)

    def read(self, name: str, lo: int, hi: int, out: Tensor) -> None:
        start, before = time.perf_counter(), self.bytes_read
        super().read(name, lo, hi, out)
        self._wait(start, self.bytes_read - before)

    def write(self, name: str, lo: int, hi: int, src: Tensor) -> None:
        start, before = time.perf_counter(), self.bytes_written
        super().write(name, lo, hi, src)
        self._wait(start, self.bytes_written - before)

    def _written(self, name: str, lo: int, hi: int) -> None:
        self.inner._written(name, lo, hi)

    def close(self) -> None:
        self.inner.close()


def make_store(tier: str, *, folder: str | os.PathLike | None = None, pin: bool = False,
               cold: bool = False) -> Store:
    """A store for `tier` ("cpu": `HostStore(pin=pin)`, "nvme": `FileStore(folder, cold=cold)`)."""
    if tier == "cpu":
        return HostStore(pin=pin)
    if tier == "nvme":
        return FileStore(folder, cold=cold)
    raise ValueError(f"make_store: tier must be one of {TIERS}, got {tier!r}")


__all__ = ["TIERS", "FileStore", "HostStore", "Store", "ThrottledStore", "host_tensor",
           "make_store"]
