"""Decoding what ranks send back when their code is not trusted (`spawn(..., trusted=False)`).

A pickle can name any importable callable and have the reader call it, so unpickling bytes
from a process that runs someone else's code lets that code run in ours. `loads` here accepts
plain data only: None, bool, int, float, complex, str, bytes, bytearray, and lists, tuples,
dicts, sets and frozensets of them (the outcome frames carry nothing else: results built by a
harness that encodes tensors as bytes, events as tuples, errors as text). Anything else fails
with `pickle.UnpicklingError` before any object is built.
"""

from __future__ import annotations

import io
import pickle

_ALLOWED = {("builtins", name) for name in ("set", "frozenset", "bytearray", "complex")}


class _PlainData(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"refused to load {module}.{name}: results of untrusted ranks must be plain data")


def loads(data: bytes):
    """Unpickle `data`, allowing plain data only."""
    return _PlainData(io.BytesIO(data)).load()


__all__ = ["loads"]
