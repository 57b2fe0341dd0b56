"""The roofline of the machine we are on, measured, and the course's layers and training step
timed on it (lesson 06).

* `measure_roof`: peak FLOP/s from n × n matmuls (the best size's median) and memory bandwidth
  from two STREAM kernels over arrays larger than the caches (McCalpin, "Memory Bandwidth and
  Machine Balance in Current High Performance Computers", IEEE TCCA Newsletter, 1995): copy
  (b ← a, 2 words per element) and add (c ← a + b, 3 words); STREAM's convention counts the
  words the kernel names, not the extra read a cache does before writing a line.
* `measure_layers`: TinyGPT's ln_1, up_proj and attention core, forward, at several
  micro-batch sizes: their FLOPs and bytes from `toolkit.roofline`, their time measured here.
* `measure_steps`: a TinyGPT training step (forward + backward) per micro-batch size, its model
  FLOPs from `toolkit.flops.step_flops`: the numerator of MFU.

Timing on a shared CPU (`time_kernel`): every trial records wall time (`time.perf_counter`) and
the CPU time of the calling thread (`time.thread_time`). With one intra-op thread (`one_thread`)
the thread does all the work, so its CPU time is the kernel's time *while it held a core*: the
moments the scheduler gave the core to another process count in wall time only. On a GPU both
are wall time between synchronisations. Results are medians with interquartile ranges
(`toolkit.cost.spread`); a rate's quartiles come from the time's (F / t is monotone).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

import torch

from ..arguments import check_int
from ..cost.spread import Spread, spread
from ..flops import step_flops
from ..models import GPTConfig, TinyGPT, make_token_data
from ..roofline import Kernel, Roof, attention, layernorm, linear

__all__ = ["measure_layers", "measure_roof", "measure_steps", "one_thread", "time_kernel"]

MIN_TRIAL_S = 5e-4  # repeat a short kernel within a trial until a trial lasts this long


@contextmanager
def one_thread() -> Iterator[None]:
    """torch's intra-op threads set to 1 inside the block (what one rank gets), restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def time_kernel(fn: Callable[[], object], *, trials: int = 9,
                device: torch.device | str = "cpu") -> dict[str, Spread]:
    """Seconds per call of ``fn()``: ``{"wall": Spread, "core": Spread}`` over `trials` trials,
    after one warm-up call. A trial repeats a short ``fn`` until it lasts ~0.5 ms and divides.
    On CPU ``core`` is the calling thread's CPU time (run under `one_thread`); on CUDA both are
    wall time between synchronisations."""
    check_int("time_kernel", "trials", trials)
    dev = torch.device(device)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    fn()  # warm-up: allocations, kernel choice
    sync()
    first = time.perf_counter() - t0
    reps = max(1, int(MIN_TRIAL_S / max(first, 1e-7)))
    wall, core = [], []
    for _ in range(trials):
        sync()
        # The CPU-time window lies inside the wall one (opened after it, closed before it), so
        # each trial's core time is at most its wall time, and so is the median of each.
        w = time.perf_counter()
        c = time.thread_time()
        for _ in range(reps):
            fn()
        sync()
        c = time.thread_time() - c
        wall.append((time.perf_counter() - w) / reps)
        core.append(c / reps if dev.type != "cuda" else wall[-1])
    return {"wall": spread(wall), "core": spread(core)}


def _row(name: str, timing: dict[str, Spread], *, flops: float = 0.0, nbytes: float = 0.0,
         **extra: object) -> dict:
    """A table row: the work, then per clock the median time and the rate (FLOP/s, or byte/s
    for a kernel that does no arithmetic) with its quartiles."""
    row = {**extra, "kernel": name, "flops": flops, "bytes": nbytes,
           "intensity": flops / nbytes if flops and nbytes else None}
    work, unit = (flops, "FLOP/s") if flops else (nbytes, "B/s")
    for clock, s in timing.items():
        row[f"{clock} s"] = s.median
        row[f"{clock} {unit}"] = work / s.median
        row[f"{clock} {unit} q25"] = work / s.q75  # the slower quartile of time
        row[f"{clock} {unit} q75"] = work / s.q25
    return row


def _kernel_row(kernel: Kernel, timing: dict[str, Spread], **extra: object) -> dict:
    return _row(kernel.name, timing, flops=kernel.flops, nbytes=kernel.bytes, **extra)


def _stream_rows(n: int, *, trials: int, device: torch.device, label: str) -> list[dict]:
    """STREAM's copy and add over float32 arrays of n elements (freed on return)."""
    x = torch.randn(n, device=device)
    y, z = torch.empty_like(x), torch.empty_like(x)
    rows = []
    for kernel, words, fn in (("copy", 2, lambda: y.copy_(x)),
                              ("add", 3, lambda: torch.add(x, y, out=z))):
        rows.append(_row(f"{kernel} {label}", time_kernel(fn, trials=trials, device=device),
                         nbytes=float(words * 4 * n), what="bandwidth"))
    return rows


def measure_roof(*, sizes: Sequence[int] = (256, 512, 1024), stream_mib: int = 64,
                 trials: int = 9, device: torch.device | str = "cpu",
                 name: str | None = None) -> tuple[Roof, list[dict]]:
    """This machine's `Roof` and the table it comes from (module docstring): the peak is the
    best matmul size's median FLOP/s in core time, the bandwidth the better STREAM kernel's
    median byte/s in core time. Rows carry both clocks."""
    dev = torch.device(device)
    check_int("measure_roof", "stream_mib", stream_mib)
    rows = []
    with one_thread():
        for n in sizes:
            check_int("measure_roof", "size", n)
            a = torch.randn(n, n, device=dev)
            b = torch.randn(n, n, device=dev)
            k = Kernel(f"matmul {n}", 2.0 * n ** 3, 3.0 * 4 * n * n)  # read a, b; write a @ b
            rows.append(_kernel_row(k, time_kernel(lambda a=a, b=b: a @ b, trials=trials,
                                                   device=dev), what="peak FLOP/s"))
        rows += _stream_rows(stream_mib * 2 ** 20 // 4, trials=trials, device=dev,
                             label=f"{stream_mib} MiB")
    peak = max(r["core FLOP/s"] for r in rows if r["what"] == "peak FLOP/s")
    bandwidth = max(r["core B/s"] for r in rows if r["what"] == "bandwidth")
    label = name or (f"this machine, 1 core ({dev.type})" if dev.type == "cpu"
                     else f"this machine ({dev})")
    return Roof(label, peak, bandwidth), rows


def measure_layers(cfg: GPTConfig, micro_batches: Sequence[int], *, trials: int = 9,
                   device: torch.device | str = "cpu") -> list[dict]:
    """Forward of one TinyGPT block's ln_1, up_proj and attention core per micro-batch size,
    timed here (no autograd), with the FLOPs, bytes and intensity `toolkit.roofline` gives."""
    dev = torch.device(device)
    block = TinyGPT(cfg, device=dev).blocks[0]
    s, h, nh, hd = cfg.seq_len, cfg.d_model, cfg.n_head, cfg.head_dim
    rows = []
    with one_thread(), torch.no_grad():
        for b in micro_batches:
            check_int("measure_layers", "micro_batch", b)
            x = torch.randn(b, s, h, device=dev)
            q, k, v = (torch.randn(b, nh, s, hd, device=dev) for _ in range(3))
            cases = (
                (layernorm(b * s, h, name="ln_1"), lambda x=x: block.ln_1(x)),
                (linear(b * s, h, cfg.ff_dim, name="up_proj"), lambda x=x: block.mlp.up_proj(x)),
                (attention(b, s, h, nh), lambda q=q, k=k, v=v: block.attn.attend(q, k, v)),
            )
            for kernel, fn in cases:
                rows.append(_kernel_row(kernel, time_kernel(fn, trials=trials, device=dev),
                                        micro_batch=b, tokens=b * s))
    return rows


def measure_steps(cfg: GPTConfig, micro_batches: Sequence[int], *, trials: int = 5,
                  device: torch.device | str = "cpu") -> list[dict]:
    """One TinyGPT training step (forward + backward, no optimizer) per micro-batch size:
    model FLOPs (`step_flops`, 6N + 12·L·h·s per token) and the time measured here."""
    dev = torch.device(device)
    model = TinyGPT(cfg, device=dev)
    rows = []
    with one_thread():
        for b in micro_batches:
            check_int("measure_steps", "micro_batch", b)
            x, y = make_token_data(b, cfg.seq_len, cfg.vocab_size, device=dev)

            def step(x=x, y=y) -> None:
                model.zero_grad(set_to_none=True)
                model(x, y)[1].backward()

            rows.append(_row("train step", time_kernel(step, trials=trials, device=dev),
                             flops=step_flops(cfg, b)["model"], micro_batch=b,
                             tokens=b * cfg.seq_len))
    return rows
