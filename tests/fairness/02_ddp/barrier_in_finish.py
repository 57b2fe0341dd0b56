"""Variant: a dist.barrier() at the end of finish() (README: barrier is allowed)."""
# ruff: noqa: F821 - a fragment appended to ddp.py, which defines DDP, dist

_finish_then_barrier = DDP.finish


def _finish_with_barrier(self) -> None:
    _finish_then_barrier(self)
    dist.barrier()


DDP.finish = _finish_with_barrier
