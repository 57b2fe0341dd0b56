"""The GPUs this host has, counted without waking the CUDA driver; and whether it is awake.

Why this module exists: CUDA cannot be used in a child forked after the parent initialised
the driver (cuInit); the child's first CUDA call fails with "initialization error" (CUDA C
Programming Guide, "Initialization": the driver state is not carried across fork()). torch's
``torch.cuda.is_available()`` calls ``cudaGetDeviceCount``, which runs cuInit, while
``torch.cuda.is_initialized()`` stays False; so does the autograd engine the first time any
backward runs on a machine with GPUs visible (it asks every device type for its count to start
one thread per GPU, and from then on a forked child's backward raises "Unable to handle
autograd's threading in combination with fork-based multiprocessing"). A launcher that asks
torch how many GPUs there are, then forks ranks, breaks every rank.

So the course asks here, and only here (tests/test_fork_safety.py fails on any other caller
of those torch functions in code that may fork):

* `gpu_count()` / `visible_gpus()`: NVML (``libnvidia-ml.so.1`` through ctypes: nvmlInit,
  nvmlDeviceGetCount, names, UUIDs, memory; NVML is the management library and never
  creates a CUDA context) with ``CUDA_VISIBLE_DEVICES`` applied as CUDA applies it; where
  NVML cannot answer (no library, MIG UUIDs, ROCm), a child interpreter counts with torch, so
  the driver starts in that child and never here. A CPU build of torch counts 0 at once.
* `driver_live()`: whether this process's CUDA driver is initialised, however that happened
  (a lesson cell, a library, a backward pass): libcuda is looked up among the libraries
  already loaded (``RTLD_NOLOAD``: never loads it) and asked ``cuDeviceGetCount``, which
  answers CUDA_ERROR_NOT_INITIALIZED (3) until cuInit has run. The launcher forks only while
  this is False (`toolkit.launch.launcher`).
* `hidden_cuda_env()`: the environment that hides every GPU from a CPU rank, so that nothing
  it runs (Adam's graph-capture check calls ``torch.cuda.is_available()``) reaches a GPU.

Nothing here imports anything at module import time beyond the standard library and torch,
and no function starts the CUDA driver in the calling process.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable, Mapping

import torch

NVML_LIBRARY = "libnvidia-ml.so.1"
CUDA_LIBRARY = "libcuda.so.1"
_CUDA_SUCCESS = 0
_CHILD_TIMEOUT_S = 120.0  # a cold first import of a CUDA torch reads GBs of libraries


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as NVML describes it (no CUDA context needed)."""

    index: int
    """NVML's index (the PCI order; CUDA's default order on most hosts)."""
    name: str
    uuid: str
    memory_bytes: int
    """Total device memory, bytes."""


# -- CUDA_VISIBLE_DEVICES --------------------------------------------------------------------

def parse_visible(value: str | None) -> list[int] | list[str] | None:
    """`CUDA_VISIBLE_DEVICES` read as the CUDA runtime reads it: None when unset (every GPU),
    else the ordinals (``"1,0"`` -> [1, 0]) or UUID prefixes (``"GPU-8f..."``) it lists. An
    entry that is not a number ends the list (``"0,1,x,2"`` -> [0, 1]); a repeated entry
    makes it empty; ``""`` and ``"-1"`` hide every GPU."""
    if value is None:
        return None
    entries = [e.strip() for e in value.split(",")]
    if entries and entries[0].startswith(("GPU-", "MIG-")):
        prefix = entries[0][:4]
        uuids: list[str] = []
        for e in entries:
            if not e.startswith(prefix):
                break
            if e in uuids:
                return []
            uuids.append(e)
        return uuids
    ordinals: list[int] = []
    for e in entries:
        digits = len(e) - len(e.lstrip("0123456789"))
        if digits == 0:
            break  # "", "-1", "x": the list ends here (like strtoul)
        n = int(e[:digits])
        if n in ordinals:
            return []
        ordinals.append(n)
    return ordinals


def _apply_visible(gpus: list[GpuInfo], visible: list[int] | list[str] | None) -> list[GpuInfo]:
    """The GPUs CUDA will show, in CUDA's order, given NVML's list and the parsed variable."""
    if visible is None:
        return list(gpus)
    shown: list[GpuInfo] = []
    for entry in visible:
        if isinstance(entry, int):
            match = [g for g in gpus if g.index == entry]
        else:
            match = [g for g in gpus if g.uuid.startswith(entry)]
        if len(match) != 1:
            break  # an ordinal past the last GPU, or an unknown/ambiguous UUID, ends the list
        shown.append(match[0])
    return shown


# -- NVML ------------------------------------------------------------------------------------

class Nvml:
    """The few NVML calls the course needs, through ctypes (NVML API Reference, "Device
    Queries"). Each call initialises NVML and shuts it down again: no state stays behind."""

    def __init__(self, library: str = NVML_LIBRARY) -> None:
        self.lib = ctypes.CDLL(library)  # OSError where there is no NVIDIA driver

    def gpus(self) -> list[GpuInfo] | None:
        """Every GPU NVML sees, or None when NVML does not answer."""
        lib = self.lib
        if lib.nvmlInit_v2() != 0:
            return None
        try:
            count = ctypes.c_uint(0)
            if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
                return None
            found = []
            for i in range(count.value):
                handle = ctypes.c_void_p()
                if lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) != 0:
                    return None
                name, uuid = ctypes.create_string_buffer(96), ctypes.create_string_buffer(96)
                memory = (ctypes.c_ulonglong * 3)()  # nvmlMemory_t: total, free, used
                if (lib.nvmlDeviceGetName(handle, name, 96) != 0
                        or lib.nvmlDeviceGetUUID(handle, uuid, 96) != 0):
                    return None
                total = memory[0] if lib.nvmlDeviceGetMemoryInfo(handle, memory) == 0 else 0
                found.append(GpuInfo(i, name.value.decode(errors="replace"),
                                     uuid.value.decode(errors="replace"), int(total)))
            return found
        finally:
            lib.nvmlShutdown()


_nvml_seen: list[GpuInfo] | None = None


def _nvml_gpus() -> list[GpuInfo] | None:
    """NVML's list, asked once per process (nvmlInit can take a second on a node without
    persistence mode; the GPUs a host has do not change while a process runs)."""
    global _nvml_seen
    if _nvml_seen is None:
        try:
            _nvml_seen = Nvml().gpus()
        except (OSError, AttributeError):
            return None
    return None if _nvml_seen is None else list(_nvml_seen)


_COUNT_IN_CHILD = ("import torch; "
                   "print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")


def count_in_child(env: Mapping[str, str] | None = None) -> int:
    """GPUs torch sees, counted by a fresh interpreter: the CUDA driver starts there and dies
    with it, never in this process. Seconds (it imports torch); used where NVML cannot answer."""
    try:
        out = subprocess.run([sys.executable, "-c", _COUNT_IN_CHILD], capture_output=True,
                             text=True, timeout=_CHILD_TIMEOUT_S,
                             env=dict(os.environ if env is None else env), check=True)
        return int(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError, OSError):
        return 0


def cuda_build() -> bool:
    """torch was built with CUDA (or ROCm): only then can there be GPUs to count."""
    return torch.version.cuda is not None or getattr(torch.version, "hip", None) is not None


_child_counts: dict[str | None, int] = {}


def visible_gpus(env: Mapping[str, str] | None = None, *,
                 nvml: Callable[[], list[GpuInfo] | None] | None = None,
                 child: Callable[[Mapping[str, str]], int] | None = None) -> list[GpuInfo]:
    """The GPUs a CUDA program started with `env` (default: this process's environment) would
    see, in its order, described by NVML; none on a CPU build of torch. Where NVML cannot
    describe them (no NVML, MIG instances, ROCm) the GPUs are counted by a child interpreter
    (`count_in_child`) and named "unknown" (index = position). `nvml` and `child` replace
    the NVML query and the child's count (tests)."""
    nvml = nvml or _nvml_gpus
    child = child or count_in_child
    env = os.environ if env is None else env
    if not cuda_build():
        return []
    visible = parse_visible(env.get("CUDA_VISIBLE_DEVICES"))
    if visible == []:
        return []
    mig = bool(visible) and isinstance(visible[0], str) and visible[0].startswith("MIG-")
    listed = None if (mig or getattr(torch.version, "hip", None)) else nvml()
    if listed is not None:
        return _apply_visible(listed, visible)
    key = env.get("CUDA_VISIBLE_DEVICES")
    if key not in _child_counts:
        _child_counts[key] = child(env)
    return [GpuInfo(i, "unknown", "", 0) for i in range(_child_counts[key])]


def gpu_count(env: Mapping[str, str] | None = None) -> int:
    """How many GPUs CUDA programs started from here (with `env`) see, without starting the
    CUDA driver in this process; 0 on a CPU build of torch. Where the driver is already live
    in this process, torch's own count is asked (it can do no further harm)."""
    if env is None and cuda_build() and driver_live():
        return torch.cuda.device_count()  # fork-safety: allowed, the driver is already live
    return len(visible_gpus(env))


# -- is the driver awake in this process? ----------------------------------------------------

def _mapped(name: str, maps: str | None = None) -> bool:
    """Whether a library whose file name starts with `name` is mapped into this process."""
    if maps is None:
        try:
            with open("/proc/self/maps") as f:
                maps = f.read()
        except OSError:
            return False
    return any(line.rsplit("/", 1)[-1].startswith(name) for line in maps.splitlines())


def _cuda_device_count_status() -> int | None:
    """cuDeviceGetCount's status in this process, asking an already-loaded libcuda only
    (None: libcuda is not loaded here, so no driver can be live)."""
    try:
        lib = ctypes.CDLL(CUDA_LIBRARY, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except (OSError, AttributeError):
        return None
    count = ctypes.c_int(0)
    return int(lib.cuDeviceGetCount(ctypes.byref(count)))


def driver_live(*, maps: str | None = None,
                status: Callable[[], int | None] = _cuda_device_count_status) -> bool:
    """Whether the CUDA driver has been initialised in this process (then a forked child
    cannot use CUDA, and a child forked after a backward pass cannot run one). Never loads
    or initialises anything itself. `maps` and `status` replace /proc/self/maps and the
    libcuda query (tests)."""
    if not cuda_build():
        return False
    if torch.cuda.is_initialized():
        return True
    if getattr(torch.version, "hip", None) is not None:
        return _mapped("libamdhip64", maps)  # no cheap probe there: loaded counts as live
    if not _mapped("libcuda.so", maps):
        return False
    code = status()
    # Mapped but not found by its usual name (an odd install): assume the worst.
    return code is None or code == _CUDA_SUCCESS


def hidden_cuda_env() -> dict[str, str]:
    """What a process that must not use a GPU gets in its environment: no GPU visible to
    CUDA, and torch's availability check answered from that (through NVML's rules, without
    loading any library) instead of by ``cudaGetDeviceCount``."""
    return {"CUDA_VISIBLE_DEVICES": "", "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}


__all__ = ["GpuInfo", "Nvml", "count_in_child", "cuda_build", "driver_live", "gpu_count",
           "hidden_cuda_env", "parse_visible", "visible_gpus"]
