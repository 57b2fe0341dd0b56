"""Independent random streams for one case's inputs, grader side.

A stream's seed is BLAKE2b(case seed ‖ labels), 64 bits (RFC 7693; `hashlib.blake2b`), where
the case seed is the one `grade.case_seed` derives from the grade's secret (40 bits) and the
labels name the stream ("rank", r) or ("expert", e). torch's CPU generator keeps only the low
32 bits of a seed, so a rank that recovers the seed of a stream it drew from (by brute force
over 2^32 initialisations, from the values it received) learns that stream alone: no other
stream's seed follows from it, unlike ``seed·7919 + 101 + r``.

Used by the labs' `make_inputs` (labs 05 and 07), which run in the grader only; ranks never
import this module.
"""

from __future__ import annotations

import hashlib

import torch


def stream_seed(seed: int, *labels: str | int) -> int:
    """The 64-bit seed of the stream named `labels` within case `seed` (non-negative int)."""
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"stream_seed: seed must be a non-negative int (a case's seed), "
                         f"got {seed!r}")
    text = ":".join(str(x) for x in (seed, *labels))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def generator(seed: int, *labels: str | int) -> torch.Generator:
    """A CPU generator for the stream named `labels` within case `seed`
    (e.g. ``generator(seed, "rank", r)``)."""
    return torch.Generator().manual_seed(stream_seed(seed, *labels))


__all__ = ["generator", "stream_seed"]
