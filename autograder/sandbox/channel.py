"""Frames on a rank's one channel to the courier, and tensors as plain data inside them.

A frame is ``<meta length: u32><payload length: u32><meta: JSON, UTF-8><payload: raw bytes>``.
The meta is a JSON object (never a pickle: decoding it runs no code); the payload holds the raw
bytes of the tensors the meta describes. Both sides cap what they accept before allocating:
`MAX_META` bytes of JSON, `MAX_PAYLOAD` bytes of payload per frame.

Tensors travel as a *tree*: JSON lists, ``{"__dict__": [[key, value], ...]}`` for dicts,
scalars (int, float, str, bool, None) as themselves, and ``{"__tensor__": [dtype, shape,
offset, nbytes]}`` for a tensor whose bytes sit at ``payload[offset:offset + nbytes]``.
`pack` builds (tree, payload) from Python values; `unpack` rebuilds them and refuses anything
that does not add up (a dtype torch lacks, a shape whose bytes differ from nbytes, an offset
outside the payload, two tensors naming the same bytes), raising `FrameError`. `pack` gives
each tensor bytes of its own, so a tree whose tensors overlap was written by hand: without the
check one 8 MiB payload named by 200 nodes decoded into 200 copies (1.6 GB in the grader).

`FrameReader` is the courier's incremental parser for a non-blocking socket; `send_frame` and
`recv_frame` are the rank's blocking forms.
"""

from __future__ import annotations

import json
import math
import socket
import struct
from typing import Any

import torch

HEADER = struct.Struct("<II")
MAX_META = 4 << 20          # bytes of JSON per frame
MAX_PAYLOAD = 64 << 20      # bytes of tensor data per frame
MAX_DEPTH = 32              # nesting of lists and dicts in a tree
MAX_EXTENT = 1 << 40        # product of a tensor's dimensions (zeros as ones)
DTYPES = {name: getattr(torch, name) for name in (
    "float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8",
    "bool", "complex64", "complex128")}


class FrameError(ValueError):
    """A frame (or a tree inside one) that breaks the format."""


def encode_frame(meta: dict, payload: bytes = b"") -> bytes:
    raw = json.dumps(meta, separators=(",", ":")).encode()
    if len(raw) > MAX_META or len(payload) > MAX_PAYLOAD:
        raise FrameError(f"frame too large: {len(raw):,} bytes of meta, {len(payload):,} of "
                         "payload")
    return HEADER.pack(len(raw), len(payload)) + raw + payload


def decode_meta(raw: bytes) -> dict:
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise FrameError(f"meta is not JSON ({type(err).__name__})") from None
    if not isinstance(meta, dict):
        raise FrameError(f"meta is a {type(meta).__name__}, not an object")
    return meta


class FrameReader:
    """Feed bytes as they arrive; take complete (meta, payload) frames out."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def feed(self, data: bytes) -> None:
        self.buf += data

    def frames(self) -> list[tuple[dict, bytes]]:
        out = []
        while len(self.buf) >= HEADER.size:
            n_meta, n_payload = HEADER.unpack_from(self.buf)
            if n_meta > MAX_META or n_payload > MAX_PAYLOAD:
                raise FrameError(f"frame header announces {n_meta:,} + {n_payload:,} bytes, "
                                 f"over the caps ({MAX_META:,} + {MAX_PAYLOAD:,})")
            end = HEADER.size + n_meta + n_payload
            if len(self.buf) < end:
                break
            with memoryview(self.buf) as view:  # one copy of the payload, not a slice and a copy
                meta = decode_meta(bytes(view[HEADER.size:HEADER.size + n_meta]))
                payload = bytes(view[HEADER.size + n_meta:end])
            out.append((meta, payload))
            del self.buf[:end]
        return out


def send_frame(sock: socket.socket, meta: dict, payload: bytes = b"") -> None:
    sock.sendall(encode_frame(meta, payload))


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise EOFError("the channel closed")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def recv_frame(sock: socket.socket) -> tuple[dict, bytes]:
    n_meta, n_payload = HEADER.unpack(_recv_exactly(sock, HEADER.size))
    if n_meta > MAX_META or n_payload > MAX_PAYLOAD:
        raise FrameError(f"frame header announces {n_meta:,} + {n_payload:,} bytes")
    meta = decode_meta(_recv_exactly(sock, n_meta))
    return meta, _recv_exactly(sock, n_payload)


# -- tensors as plain data --------------------------------------------------------------------

def tensor_bytes(t: torch.Tensor) -> bytes:
    """The raw bytes of a CPU copy of `t` (any device, any layout)."""
    t = t.detach().to("cpu").contiguous()
    if t.dtype.is_complex:
        t = torch.view_as_real(t)
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def pack(value: Any) -> tuple[Any, bytes]:
    """(tree, payload) for `value`: tensors anywhere inside lists, tuples and dicts."""
    parts: list[bytes] = []
    size = [0]

    def walk(v: Any, depth: int) -> Any:
        if depth > MAX_DEPTH:
            return {"__unsupported__": "nesting"}
        if isinstance(v, torch.Tensor):
            raw = tensor_bytes(v)
            node = {"__tensor__": [dtype_name(v), list(v.shape), size[0], len(raw)]}
            parts.append(raw)
            size[0] += len(raw)
            return node
        if isinstance(v, (list, tuple)):
            return [walk(x, depth + 1) for x in v]
        if isinstance(v, dict):
            return {"__dict__": [[str(k), walk(x, depth + 1)] for k, x in v.items()]}
        if v is None or isinstance(v, (bool, int, str)):
            return v
        if isinstance(v, float):
            return v if math.isfinite(v) else {"__float__": repr(v)}
        return {"__unsupported__": type(v).__name__}

    tree = walk(value, 0)
    return tree, b"".join(parts)


def good_shape(shape: Any) -> bool:
    """A list of at most 16 non-negative ints whose extents multiply (zeros counted as ones)
    to at most MAX_EXTENT: a zero-byte tensor of shape [2**63, 0] passes every size check but
    overflows torch's stride arithmetic, so every dimension is bounded, not just the bytes."""
    return isinstance(shape, list) and len(shape) <= 16 and all(
        isinstance(s, int) and not isinstance(s, bool) and 0 <= s for s in shape) \
        and math.prod(max(s, 1) for s in shape) <= MAX_EXTENT


def make_tensor(dtype: str, shape: Any, raw: bytes) -> torch.Tensor:
    """A tensor of `dtype` and `shape` from exactly its bytes; FrameError otherwise."""
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise FrameError(f"unknown dtype {str(dtype)[:40]!r}")
    if not good_shape(shape):
        raise FrameError(f"bad shape {str(shape)[:80]}")
    kind = DTYPES[dtype]
    item = torch.empty(0, dtype=kind).element_size()
    if math.prod(shape) * item != len(raw):
        raise FrameError(f"shape {shape} of {dtype} needs {math.prod(shape) * item:,} bytes, "
                         f"got {len(raw):,}")
    flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else \
        torch.empty(0, dtype=torch.uint8)
    if kind.is_complex:
        real = torch.float64 if kind == torch.complex128 else torch.float32
        return torch.view_as_complex(flat.view(real).reshape(shape + [2]).clone())
    return flat.view(kind).reshape(shape).clone()


class TreeTooLarge(FrameError):
    """A tree with more nodes, or decoding into more bytes, than the caller allows
    (`unpack_counted`); `what` says which: "values" or "bytes"."""

    def __init__(self, message: str, what: str = "values") -> None:
        super().__init__(message)
        self.what = what


def tensor_spans(tree: Any, max_nodes: int | None = None) -> list[tuple[int, int]]:
    """(offset, nbytes) of every tensor node of `tree` that names bytes, without building
    anything; TreeTooLarge past `max_nodes` nodes (counted as `unpack_counted` counts them),
    FrameError past MAX_DEPTH. No recursion: depth is a number on a stack."""
    spans: list[tuple[int, int]] = []
    stack, walked = [(tree, 0)], 0
    while stack:
        node, depth = stack.pop()
        walked += 1
        if max_nodes is not None and walked > max_nodes:
            raise TreeTooLarge(f"more than {max_nodes:,} values")
        if depth > MAX_DEPTH:
            raise FrameError("tree nested too deeply")
        if isinstance(node, list):
            stack.extend((x, depth + 1) for x in node)
        elif isinstance(node, dict):
            spec = node.get("__tensor__")
            if isinstance(spec, list) and len(spec) == 4 and all(
                    isinstance(x, int) and not isinstance(x, bool) for x in spec[2:]):
                if spec[3] > 0:
                    spans.append((spec[2], spec[3]))
            elif isinstance(node.get("__dict__"), list):
                stack.extend((i[1], depth + 1) for i in node["__dict__"]
                             if isinstance(i, list) and len(i) == 2)
    return spans


def disjoint(tree: Any, payload_bytes: int, *, max_nodes: int | None = None) -> int:
    """The bytes `tree`'s tensors decode into (their nbytes added up); FrameError when two
    tensor nodes name overlapping bytes of the payload, or any names bytes outside it. Sorting
    the spans makes it O(n log n) in the nodes; nothing is built."""
    total, end = 0, 0
    for offset, nbytes in sorted(tensor_spans(tree, max_nodes)):
        if offset < 0 or offset + nbytes > payload_bytes:
            raise FrameError("tensor bytes outside the payload")
        if offset < end:
            raise FrameError(f"two tensors name the same bytes of the payload (at {offset:,}): "
                             "each tensor must have bytes of its own")
        end = offset + nbytes
        total += nbytes
    return total


def unpack(tree: Any, payload: bytes) -> Any:
    """The values `pack` encoded. Raises FrameError on anything malformed."""
    return unpack_counted(tree, payload)[0]


def unpack_counted(tree: Any, payload: bytes, *, max_nodes: int | None = None,
                   max_bytes: int | None = None) -> tuple[Any, int, int]:
    """(`unpack`'s values, the tree's nodes, the bytes its tensors decode into). Before any
    tensor is built: TreeTooLarge past `max_nodes` nodes (lists, dicts, tensors and leaves
    count one each: 4 MiB of JSON holds over a million empty lists, about 100 MiB once built,
    so what a grader keeps is bounded in nodes as well as bytes) or past `max_bytes` decoded
    bytes; FrameError when two tensor nodes name the same bytes (`disjoint`: one 8 MiB payload
    named by 200 nodes would decode into 1.6 GB), so the decoded bytes are at most the
    payload's."""
    decoded = disjoint(tree, len(payload), max_nodes=max_nodes)
    if max_bytes is not None and decoded > max_bytes:
        raise TreeTooLarge(f"{decoded:,} bytes of tensors, over {max_bytes:,}", "bytes")
    count = 0

    def walk(node: Any, depth: int) -> Any:  # `disjoint` bounded the nodes and the depth
        nonlocal count
        count += 1
        if isinstance(node, list):
            return [walk(x, depth + 1) for x in node]
        if isinstance(node, dict):
            if "__tensor__" in node:
                spec = node["__tensor__"]
                if not (isinstance(spec, list) and len(spec) == 4):
                    raise FrameError("bad tensor node")
                dtype, shape, offset, nbytes = spec
                if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                           for x in (offset, nbytes)) or offset + nbytes > len(payload):
                    raise FrameError("tensor bytes outside the payload")
                return make_tensor(dtype, shape, payload[offset:offset + nbytes])
            if "__dict__" in node:
                items = node["__dict__"]
                if not isinstance(items, list) or not all(
                        isinstance(i, list) and len(i) == 2 and isinstance(i[0], str)
                        for i in items):
                    raise FrameError("bad dict node")
                return {k: walk(v, depth + 1) for k, v in items}
            if "__float__" in node:
                return float(node["__float__"]) if node["__float__"] in ("nan", "inf", "-inf") \
                    else None
            if "__unsupported__" in node:
                return {"__unsupported__": str(node["__unsupported__"])[:80]}
            raise FrameError("unknown node")
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        raise FrameError(f"unexpected {type(node).__name__}")

    return walk(tree, 0), count, decoded


__all__ = ["DTYPES", "FrameError", "FrameReader", "MAX_META", "MAX_PAYLOAD", "TreeTooLarge",
           "decode_meta", "disjoint", "dtype_name", "encode_frame", "good_shape", "make_tensor",
           "pack", "recv_frame", "send_frame", "tensor_bytes", "tensor_spans", "unpack",
           "unpack_counted"]
