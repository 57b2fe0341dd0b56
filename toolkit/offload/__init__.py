"""Offload: optimizer states (and fp32 master weights) kept off the device, in host memory or a
memory-mapped file, and streamed through the device chunk by chunk during the step.

    from toolkit.offload import OffloadOptimizer, offloaded
    with OffloadOptimizer(model.parameters(), torch.optim.Adam, tier="nvme", lr=1e-3) as opt:
        loss.backward(); opt.step()
        opt.last_step.bytes_read, opt.last_step.bytes_written      # exact, per step
    ShardedOptimizer(model.parameters(), offloaded(torch.optim.Adam, tier="cpu"), stage=2)

`store` holds the tiers (`HostStore`: CPU memory, pinned on a GPU machine; `FileStore`: a
memory-mapped file, the NVMe tier; `ThrottledStore`: either behind an emulated link);
`optimizer` the step that reads, updates and writes back
each chunk, with a prefetching I/O thread. ZeRO-Offload (Ren et al., USENIX ATC 2021) and
ZeRO-Infinity (Rajbhandari et al., SC 2021); the bytes per tier are in `toolkit.memory.offload`,
the step-time model in `toolkit.cost.offload`, runs on ranks in `toolkit.experiments.offload`.
"""

from .optimizer import MASTER, OffloadOptimizer, Span, StepStats, offloaded
from .store import TIERS, FileStore, HostStore, Store, ThrottledStore, host_tensor, make_store

__all__ = ["MASTER", "TIERS", "FileStore", "HostStore", "OffloadOptimizer", "Span", "StepStats",
           "Store", "ThrottledStore", "host_tensor", "make_store", "offloaded"]
