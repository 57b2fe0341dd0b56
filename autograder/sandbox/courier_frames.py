"""What the courier accepts from a rank, frame by frame, and what each frame does.

Every field is checked before it is used: a frame a rank could have forged (raw bytes written
to its channel, any types in its JSON) either fits the protocol below or ends the launch with
kind ``tampering`` and the reason; it never raises into the grader.

From a rank: ``hello`` (first, from trusted code: how the rank is confined), ``ready`` (the
student's module imported), ``op`` (one torch.distributed call: id, op, group, peer or root,
tag, async, input tensors' specs + bytes, output specs), ``wait`` / ``seen`` (it waits on an op,
or saw it complete; with its Python stack), ``mark`` (a label between calls), ``gate`` (a
round trip: the courier records a `Gate` where it read the frame among the rank's calls and
answers the scale `gate.scale(case key, n)` for the rank's n-th gate of the case; refused
outside a case), ``output`` (a case's result as a tensor tree), ``error`` (an exception's
type, message and traceback).

What each frame leaves in the grader is capped (the bounds are in `courier`'s docstring): an
``op``, a ``mark`` or a ``gate`` is one recorded call (`Courier.count_call`, at most MAX_CALLS per
launch, then call_limit); a ``wait`` keeps its stack (40 frames of capped text) for at most
MAX_STACKS calls of a rank at once, later ones without it; ``output`` frames are one per case
and rank, the bytes their tensors decode into at most RESULT_BYTES per launch (then
result_limit; each tensor must name bytes of its own, `channel.disjoint`, so a payload cannot
be decoded twice); ``seen``, a repeated
``wait`` and any ``error`` after the first keep nothing new.
"""

from __future__ import annotations

import math
from typing import Any

from ..protocol import Gate, Op, RankEnd, canonical_op
from ..sanitize import printable
from .channel import (DTYPES, MAX_PAYLOAD, FrameError, TreeTooLarge, good_shape, make_tensor,
                      unpack_counted)
from .courier import RESULT_BYTES, RESULT_NODES, RESULT_NODES_USED, Courier, Pending
from .gate import LOCAL_KEY, scale
from .reduce import COLLECTIVES, ROOTED

OPS = frozenset({"send", "recv", "alltoall", "alltoall_base"} | set(COLLECTIVES))


class Refused(Exception):
    """A frame that breaks the protocol."""


def _int(value: Any, what: str, lo: int | None = None, hi: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise Refused(f"{what} is {type(value).__name__}, not an integer")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise Refused(f"{what} {value} is out of range")
    return value


def _str(value: Any, what: str, cap: int = 200) -> str:
    """Text from a rank: checked, capped, and with every control character made visible."""
    if not isinstance(value, str):
        raise Refused(f"{what} is {type(value).__name__}, not text")
    return printable(value[:cap])


def _spec(value: Any, what: str) -> tuple[str, list[int]]:
    if not (isinstance(value, list) and len(value) >= 2 and isinstance(value[0], str)
            and value[0] in DTYPES and good_shape(value[1])):
        raise Refused(f"{what} is not a (dtype, shape) pair")
    return value[0], list(value[1])


def _stack(value: Any) -> list:
    if not isinstance(value, list):
        return []
    return [[str(f[0])[:500], f[1], str(f[2])[:100]] for f in value[-40:]
            if isinstance(f, list) and len(f) == 3 and isinstance(f[1], int)]


def _op(c: Courier, rank: int, meta: dict, payload: bytes) -> None:
    state = c.ranks[rank]
    if not c.count_call(rank):
        return
    op_id = _int(meta.get("id"), "id", 0)
    if op_id in state.ids:
        raise Refused(f"op id {op_id} used twice")
    state.ids.add(op_id)
    name = _str(meta.get("op"), "op")
    if name not in OPS:
        raise Refused(f"unknown op {name!r}")
    group = meta.get("group")
    if not (isinstance(group, list) and group and all(isinstance(g, int) for g in group)
            and group == sorted(set(group)) and 0 <= group[0] and group[-1] < c.world_size
            and rank in group):
        raise Refused("group is not a sorted list of ranks holding this one")
    inputs, specs, offset = [], [], 0
    for k, spec in enumerate(meta.get("inputs") if isinstance(meta.get("inputs"), list) else []):
        if not (isinstance(spec, list) and len(spec) == 4):
            raise Refused(f"input {k} is not (dtype, shape, offset, nbytes)")
        dtype, shape = _spec(spec, f"input {k}")
        if spec[2] != offset or not isinstance(spec[3], int) or offset + spec[3] > len(payload):
            raise Refused(f"input {k}'s bytes are not where it says")
        try:
            inputs.append(make_tensor(dtype, shape, payload[offset:offset + spec[3]]))
        except FrameError as err:
            raise Refused(f"input {k}: {err}") from None
        offset += spec[3]
    if offset != len(payload):
        raise Refused(f"{len(payload) - offset:,} bytes of payload that no input describes")
    outs = meta.get("outputs") if isinstance(meta.get("outputs"), list) else []
    for k, spec in enumerate(outs):
        specs.append(_spec(spec, f"output {k}"))
    if sum(math.prod(s) for _, s in specs) * 16 > MAX_PAYLOAD:
        raise Refused("outputs larger than a frame may carry")
    first = inputs[0] if inputs else None
    nbytes = sum(t.numel() * t.element_size() for t in inputs)
    if first is not None:
        dtype, shape = str(first.dtype).removeprefix("torch."), tuple(first.shape)
    else:
        dtype, shape = (specs[0][0], tuple(specs[0][1])) if specs else ("", ())
    if name == "recv" and specs:
        nbytes = math.prod(specs[0][1]) * DTYPES[specs[0][0]].itemsize
    peer = meta.get("peer")
    op = Op(rank, state.seq, name, peer if isinstance(peer, int) else None, nbytes, dtype, shape,
            bool(meta.get("async") is True), tuple(group))
    state.seq += 1
    state.ops[op_id] = op
    traffic = c.traffic_of(rank)
    if traffic is not None:
        traffic.add(op)
    pending = Pending(op, op_id, inputs, specs, _str(meta.get("reduce", "sum"), "reduce", 20),
                      None, _int(meta.get("tag", 0), "tag"))
    state.pending[op_id] = pending
    if name in ("send", "recv"):
        _p2p(c, pending, payload)
        return
    if canonical_op(name) not in c.allowed:
        op.refused = c.refusal.format(op=name)
        c.fail_op(pending, op.refused)
        return
    if name not in COLLECTIVES:
        c.fail_op(pending, f"the grader does not support {name}")
        return
    if name in ROOTED:
        root = meta.get("root")
        if not isinstance(root, int) or root not in group:
            c.fail_op(pending, f"{name}: the root is not a rank of the group")
            return
        pending.root = op.peer = root
    c.post_collective(pending)


def _p2p(c: Courier, p: Pending, payload: bytes) -> None:
    op = p.op
    if op.op == "send" and len(p.inputs) != 1 or op.op == "recv" and len(p.specs) != 1:
        raise Refused(f"{op.op} of {len(p.inputs) or len(p.specs)} tensors")
    peer = op.peer
    lowest = -1 if op.op == "recv" else 0
    if peer is None or not lowest <= peer < c.world_size or peer == op.rank:
        c.fail_op(p, f"Invalid {'destination' if op.op == 'send' else 'source'} rank {peer}: "
                     f"use a rank from 0 to {c.world_size - 1} other than this one ({op.rank})")
        return
    if op.op == "send":
        p.inputs = []  # the payload is what is delivered: hold the bytes once, not twice
        c.post_send(p, payload)
    else:
        c.post_recv(p)


def _observe(c: Courier, rank: int, meta: dict, blocking: bool) -> None:
    state = c.ranks[rank]
    op_id = _int(meta.get("id"), "id", 0)
    op = state.ops.get(op_id)
    if op is None:
        raise Refused(f"{meta.get('k')} for op {op_id}, which was never made")
    traffic = c.traffic_of(rank)
    if not op.observed:
        op.observed = True
        op.observed_at = len(traffic.entries) if traffic is not None else None
    if blocking and op_id in state.pending:
        state.block(op_id, _stack(meta.get("stack")))


def _gate(c: Courier, rank: int, payload: bytes) -> None:
    """Record the rank's next gate in its case's traffic, where it was read among its calls,
    and answer it with that gate's scale (`gate.scale`: from the case's key, never the rank)."""
    traffic = c.traffic_of(rank)
    if traffic is None:
        raise Refused("a gate outside a case")
    if payload:
        raise Refused("a gate with a payload")
    if not c.count_call(rank):
        return
    n = len(traffic.gates)
    entry = Gate(n, scale(c.plan[c.ranks[rank].case].gate or LOCAL_KEY, n))
    traffic.add(entry)
    c.reply(rank, {"k": "gate", "n": n, "scale": entry.scale})


def handle(c: Courier, rank: int, meta: dict, payload: bytes) -> None:
    """Apply one frame from `rank`; a frame outside the protocol fails the launch."""
    try:
        _handle(c, rank, meta, payload)
    except Refused as err:
        c.fail("tampering", f"Rank {rank} wrote a frame the grader's courier does not accept "
                            f"({err}): only torch.distributed calls may use the channel.", rank)
    except Exception as err:  # noqa: BLE001 - a frame no check foresaw must not fail the grader
        c.fail("tampering", f"Rank {rank} wrote a frame the grader's courier could not apply "
                            f"({type(err).__name__}: {printable(str(err)[:200])}): only "
                            "torch.distributed calls may use the channel.", rank)


def _handle(c: Courier, rank: int, meta: dict, payload: bytes) -> None:
    state, kind = c.ranks[rank], meta.get("k")
    if state.confined is None:
        if kind != "hello" or not isinstance(meta.get("confined"), dict):
            raise Refused("the first frame is not the rank's hello")
        state.confined = meta["confined"]
    elif kind == "ready" and not state.ready:
        state.ready = True
        c.next_case(rank)
    elif kind == "op":
        _op(c, rank, meta, payload)
    elif kind in ("wait", "seen"):
        _observe(c, rank, meta, kind == "wait")
    elif kind == "mark":
        traffic = c.traffic_of(rank)
        if c.count_call(rank) and traffic is not None:
            traffic.add(_str(meta.get("label"), "label"))
    elif kind == "gate":
        _gate(c, rank, payload)
    elif kind == "output":
        case = c.plan[state.case] if state.case is not None else None
        if case is None or meta.get("case") != case.index:
            raise Refused("an output for a case it was not running")
        try:  # every limit is checked before a tensor is built (`unpack_counted`)
            value, nodes, decoded = unpack_counted(
                meta.get("tree"), payload, max_nodes=RESULT_NODES - c.result_nodes,
                max_bytes=RESULT_BYTES - c.returned)
        except TreeTooLarge as err:
            if err.what == "bytes":
                c.fail("result_limit", f"The ranks returned over {RESULT_BYTES / 2**20:,.0f} MiB "
                                       f"of results in one launch; the grader keeps at most "
                                       f"{RESULT_BYTES / 2**20:,.0f} MiB (a correct solution "
                                       "returns about 1 MiB at most).", rank)
            else:
                c.fail("result_limit", f"The ranks returned more than {RESULT_NODES:,} values "
                                       "(tensors, lists, numbers) in one launch; a correct "
                                       f"solution returns at most {RESULT_NODES_USED:,}.", rank)
            return
        except (FrameError, RecursionError) as err:
            raise Refused(f"its output: {err}") from None
        state.outputs[case.index] = value
        c.returned += decoded  # what the grader holds: the tensors' bytes, each counted once
        c.result_nodes += nodes
        c.next_case(rank)
    elif kind == "error":
        if c.ended is None:
            c.ended = RankEnd(rank, "error", _str(meta.get("phase", "case"), "phase", 10),
                              _str(meta.get("type", ""), "type", 100),
                              _str(meta.get("message", ""), "message", 4000),
                              _str(meta.get("traceback", ""), "traceback", 8000))
    else:
        raise Refused(f"unknown frame {str(kind)[:40]!r}")


__all__ = ["handle"]
