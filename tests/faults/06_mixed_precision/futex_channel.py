"""Cheat (red team 8, `futex06`): the gradients and the inf/NaN flag travel between ranks through
futexes on a shared read-only mapping of a library every rank's world binds (one inode, so one
kernel key for all ranks): the source blocks in FUTEX_WAIT on the word that encodes (pair, slot,
byte), the sink finds it by the return value of FUTEX_WAKE. The courier sees all-reduces of bf16
zeros of exactly 2Ψ bytes and a zero float32 flag (100/100 before).
Expected: the seccomp filter refuses the shared FUTEX_WAKE (EPERM; private futexes and shared
waits are allowed), so every check that all-reduces ends in the rank's PermissionError,
sandbox_violation (this fault stops at the first refusal instead of retrying until its
deadline, as the red team's did); masters and the scaler, which need no collective, keep their
points. Had the wake gone through, the all-reduces of zeros fail the contents judges
(labs/06_mixed_precision/traffic.py; tests/test_lab06_contents.py): 32/100 with the filter's
futex rule taken out, where it scored 100 before.
"""

import ctypes as _ct
import mmap as _mmap
import os as _os
import threading as _th
import time as _time

_libc = _ct.CDLL(None, use_errno=True)
_libc.syscall.restype = _ct.c_long
_FUTEX_WAIT, _FUTEX_WAKE, _SYS_FUTEX = 0, 1, 202


class _Timespec(_ct.Structure):
    _fields_ = [("s", _ct.c_long), ("ns", _ct.c_long)]


class _FutexLink:
    WORDS = 8 * 8 * 2 * 256

    def __init__(self, rank):
        import numpy as _np

        self.rank = rank
        path = _os.path.join(_os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
        with open(path, "rb") as f:
            self.mm = _mmap.mmap(f.fileno(), 4 * self.WORDS, _mmap.MAP_SHARED, _mmap.PROT_READ)
        self.words = _np.frombuffer(self.mm, dtype=_np.uint32, count=self.WORDS)
        self.base = self.words.__array_interface__["data"][0]
        self.sent, self.got = {}, {}

    def _word(self, src, dst, slot, byte):
        i = (((src * 8 + dst) * 2 + slot) * 256) + byte
        return _ct.c_void_p(self.base + 4 * i), _ct.c_uint32(int(self.words[i]))

    def send(self, dst, data, deadline=20.0):
        ts = _Timespec(0, 20_000_000)
        end = _time.monotonic() + deadline
        for b in bytes(data):
            i = self.sent.get(dst, 0)
            addr, val = self._word(self.rank, dst, i & 1, b)
            while _time.monotonic() < end:
                if _libc.syscall(_SYS_FUTEX, addr, _FUTEX_WAIT, val, _ct.byref(ts), None, 0) == 0:
                    break
            self.sent[dst] = i + 1

    def recv(self, src, n, deadline=20.0):
        out = bytearray()
        end = _time.monotonic() + deadline
        while len(out) < n and _time.monotonic() < end:
            i = self.got.get(src, 0)
            for b in range(256):
                addr, _ = self._word(src, self.rank, i & 1, b)
                woke = _libc.syscall(_SYS_FUTEX, addr, _FUTEX_WAKE, 1, None, None, 0)
                if woke < 0:
                    err = _ct.get_errno()
                    raise PermissionError(err, f"futex link: shared FUTEX_WAKE refused: "
                                               f"{_os.strerror(err)}")
                if woke > 0:
                    out.append(b)
                    self.got[src] = i + 1
                    break
        if len(out) < n:
            raise TimeoutError(f"futex link: {len(out)}/{n} bytes from rank {src}")
        return bytes(out)

    def all_gather_bytes(self, mine, world):
        threads = [_th.Thread(target=self.send, args=(d, mine), daemon=True)
                   for d in range(world) if d != self.rank]
        for t in threads:
            t.start()
        return [mine if s == self.rank else self.recv(s, len(mine)) for s in range(world)]


_LINK = []


def _link(rank):
    if not _LINK:
        _LINK.append(_FutexLink(rank))
    return _LINK[0]


@torch.no_grad()
def _futex_unscale(self, params, masters):
    for p, m in zip(params, masters):  # right values, found without the courier
        m.grad = None if p.grad is None else p.grad.to(torch.float32, copy=True) / self.scale
    found = any(not bool(torch.isfinite(m.grad).all()) for m in masters if m.grad is not None)
    flags = _link(dist.get_rank()).all_gather_bytes(bytes([found]), dist.get_world_size())
    dist.all_reduce(torch.zeros(1, device=masters[0].device), op=dist.ReduceOp.MAX)  # decoy
    return any(f[0] for f in flags)


LossScaler.unscale_ = _futex_unscale


@torch.no_grad()
def all_reduce_gradients(params):  # noqa: F811
    params = [p for p in params if p.grad is not None]
    if not params:
        return
    flat = torch.cat([p.grad.reshape(-1).to(torch.bfloat16) for p in params])
    world = dist.get_world_size()
    raw = flat.view(torch.int16).cpu().numpy().tobytes()
    everyone = _link(dist.get_rank()).all_gather_bytes(raw, world)
    total = sum(torch.frombuffer(bytearray(b), dtype=torch.int16).view(torch.bfloat16).double()
                for b in everyone)
    dist.all_reduce(torch.zeros_like(flat))  # decoy: 2 bytes per element, all zeros
    flat = (total / world).to(device=flat.device, dtype=torch.bfloat16)
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
        offset += p.numel()
