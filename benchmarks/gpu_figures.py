"""This GPU's own figures: matmul throughput per dtype, and copy bandwidth between host and device.

What lessons 06 (roofline, MFU) and 09 (offload tiers) set beside the datasheet, measured here:

    matmul      C = A @ B, n × n × n, FLOPs = 2n³ (one multiply and one add per term);
                fp32 (TF32 off), tf32 (fp32 inputs, ``torch.backends.cuda.matmul.allow_tf32``),
                bf16, fp16; the median of `reps` timed calls after warm-up.
    copies      host → device and device → host, from pinned (page-locked) and from pageable
                host memory; device → device (a copy reads and writes: bandwidth counted both
                ways, as vendors quote it). bytes / median seconds.

Timed with CUDA events on the current stream (`torch.cuda.Event`, elapsed_time in ms): the GPU's
own clock, not the host's, so the time a launch waits in the queue is not counted.

    python benchmarks/gpu_figures.py --out results/gpu-HOST      # writes device.json there
    python benchmarks/gpu_figures.py --device cpu --quick         # the CPU rehearsal

On ``--device cpu`` (a rehearsal of the format, `make gpu-check`'s test on a machine without a
GPU) only fp32 and bf16 matmuls and a host copy are timed, with the host's clock. This script
is a CUDA process of its own: it asks torch about the GPU directly and forks nothing.
`toolkit.cost.results.load_device_figures` reads what it writes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from toolkit.cost.results import machine_meta, save_device_figures  # noqa: E402

DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
          "fp16": torch.float16}
GiB = 1 << 30


class Clock:
    """Seconds of `fn()` on the device's clock (CUDA events) or the host's (CPU)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def __call__(self, fn, reps: int, warmup: int = 2) -> float:
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(reps):
            if self.cuda:
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)  # ms -> s
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return statistics.median(times)


def matmuls(device: torch.device, n: int, reps: int, clock: Clock) -> list[dict]:
    rows = []
    names = ["fp32", "tf32", "bf16", "fp16"] if device.type == "cuda" else ["fp32", "bf16"]
    gen = torch.Generator().manual_seed(0)
    for name in names:
        dtype = DTYPES[name]
        a = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
        b = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
        out = torch.empty(n, n, device=device, dtype=dtype)
        tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
        try:
            seconds = clock(lambda a=a, b=b, out=out: torch.mm(a, b, out=out), reps)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = tf32
        flops = 2 * n**3
        rows.append({"dtype": name, "n": n, "flops": flops, "seconds": seconds,
                     "tflops": flops / seconds / 1e12})
        print(f"  matmul {name:<5} n={n}: {seconds * 1e3:8.3f} ms  {flops / seconds / 1e12:8.1f} "
              "TFLOP/s", flush=True)
    return rows


def copies(device: torch.device, nbytes: int, reps: int, clock: Clock) -> list[dict]:
    n = nbytes // 4
    rows = []

    def row(kind: str, memory: str, fn, counted: int) -> None:
        seconds = clock(fn, reps)
        rows.append({"kind": kind, "memory": memory, "bytes": counted, "seconds": seconds,
                     "gb_per_s": counted / seconds / 1e9})
        print(f"  copy {kind:<4} {memory:<8} {counted / GiB:5.2f} GiB: {seconds * 1e3:8.2f} ms  "
              f"{counted / seconds / 1e9:8.1f} GB/s", flush=True)

    if device.type != "cuda":
        src, dst = torch.ones(n), torch.empty(n)
        row("h2h", "pageable", lambda: dst.copy_(src), nbytes)
        return rows
    dev = torch.empty(n, device=device)
    dev2 = torch.empty(n, device=device)
    for memory in ("pinned", "pageable"):
        pinned = memory == "pinned"  # non_blocking only from pinned memory: a real DMA copy
        host = torch.ones(n, pin_memory=pinned)
        row("h2d", memory, lambda h=host, nb=pinned: dev.copy_(h, non_blocking=nb), nbytes)
        row("d2h", memory, lambda h=host, nb=pinned: h.copy_(dev, non_blocking=nb), nbytes)
    row("d2d", "device", lambda: dev2.copy_(dev), 2 * nbytes)  # read n bytes + write n bytes
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cuda (default: the first visible GPU) or cpu (a rehearsal)")
    ap.add_argument("--quick", action="store_true", help="small sizes, few repetitions")
    ap.add_argument("--out", type=Path, required=True, help="results folder for device.json")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_figures: no CUDA GPU is visible to torch; use --device cpu to rehearse",
              file=sys.stderr)
        return 2
    device = torch.device(args.device)
    clock = Clock(device)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        name, extra = props.name, {"memory_bytes": props.total_memory,
                                   "multiprocessors": props.multi_processor_count,
                                   "capability": f"{props.major}.{props.minor}"}
        n, nbytes, reps = (2048, 64 << 20, 5) if args.quick else (8192, GiB, 10)
    else:
        name, extra = "cpu", {}
        n, nbytes, reps = (256, 8 << 20, 3) if args.quick else (1024, 256 << 20, 5)
    print(f"gpu_figures on {name}: matmul n={n}, copies of {nbytes / GiB:.2f} GiB, "
          f"median of {reps}", flush=True)
    figures = {"name": name, **extra, "matmul": matmuls(device, n, reps, clock),
               "copies": copies(device, nbytes, reps, clock),
               "meta": machine_meta("none", gpus=[name] if device.type == "cuda" else None)}
    path = save_device_figures(figures, args.out)
    print(f"saved {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
