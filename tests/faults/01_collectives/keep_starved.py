"""Attack (red team, 2026-11-24): starve the content check. At import, before any case, ranks
0 and 1 exchange 64 MiB: the courier's per-launch keep limit (courier.KEEP_BYTES) is spent, so
no later message has its bytes kept. Expected: the ring traffic check fails (wrong_result, the
message that could not be checked is named) instead of skipping the content check; values
checks still pass.
"""

if dist.get_world_size() > 1 and dist.get_rank() in (0, 1):
    _blob = torch.zeros(4 << 20, dtype=torch.float32)  # 16 MiB
    for _ in range(4):                                  # 4 × 16 MiB = the keep limit
        if dist.get_rank() == 0:
            dist.send(_blob, 1)
        else:
            dist.recv(_blob, 0)
    del _blob
