"""Expert parallelism's arithmetic: the capacity rule, dropped tokens, and the bytes of the
all-to-alls that carry tokens to their experts and back.

**Capacity** (Fedus et al., 2022, "Switch Transformers", JMLR, §2.2, eq. 3: expert capacity =
tokens per batch / number of experts × capacity factor; Lepikhin et al., 2020, "GShard", §2.2 and
Algorithm 1, the same per *group* of tokens, with k = 2 choices per token). For a group of T
tokens (one rank's tokens, in expert parallelism), E experts and k choices per token:

    C = ⌈cf · k · T / E⌉         slots per expert and group;  cf = None: C = T (nothing dropped)

A token's j-th choice of expert e is kept when fewer than C earlier choices of the group went to
e (first choices before second ones, GShard's Algorithm 1); else it is **dropped** (its expert
output is zero; the residual connection carries the token on). With loads l_e (choices per
expert before the cut): kept_e = min(l_e, C), dropped = Σ_e max(0, l_e − C), and a padded
buffer of E·C slots computes E·C − Σ kept_e rows of padding. Imbalance = max_e l_e / (k·T/E).

**Bytes** (derived here, checked against the recorder in tests/test_expert_parallel.py). Rank r
of an expert-parallel group of ep ranks holds experts [r·E/ep, (r+1)·E/ep). Let rows[r][e] be the
rows r sends to expert e in the dispatch: kept_e of its own tokens, or C_r slots when the buffer
is padded (GShard, Switch: fixed-size buffers). Then with hidden size d and b bytes per element

    S_r = Σ_e rows[r][e]                 rows r sends in the dispatch (and gets back in combine)
    R_r = Σ_j Σ_{e on r} rows[j][e]      rows r receives for its experts (and returns)

Forward: the dispatch passes in S_r·d·b (after E counts, int64, so that every rank knows its
split sizes) and receives R_r rows; the combine passes in the R_r expert outputs and receives its
S_r rows back. Backward runs each exchange the other way, passing in the gradient of what the
rank received: S_r rows (combine's backward), then R_r (dispatch's). So per step and rank the
recorder's rule (what a rank passes in) gives 8E + 2·(S_r + R_r)·d·b, and what leaves the rank is
the pieces for other ranks (`step_bytes`). Balanced routing (every l_e = k·T/E, no drops, equal
T on every rank): S_r = R_r = k·T, so per MoE layer and step

    bytes on the wire per rank = 4 · k·T·d·b · (ep − 1)/ep        (+ counts)

and padded buffers send cf·k·T rows instead of k·T. Time: `toolkit.cost.predict("all_to_all",
"pairwise", ...)`, (ep − 1)·α + (ep − 1)/ep·n·β per all-to-all (Thakur et al., 2005).

**Across nodes** (node-limited routing, DeepSeek-V3 §2.1.2). With the ep ranks in nodes of n
consecutive ranks, what a rank sends to ranks of *other* nodes per step is the same sum over
other-node peers only: 2·(S_r^x + R_r^x)·d·b rows of tokens (forward and backward) plus the
counts to other-node ranks, S_r^x = rows r sends to experts on other nodes, R_r^x = rows its
experts receive from other nodes (`cross_node_bytes`). Limiting each token to M nodes bounds
S_r^x by k·T rows; DeepSeek-V3 also sends a token only once to each node it reaches and
forwards it inside the node over NVLink (§3.2.2), which this course's dispatch does not.

**Fine-grained and shared experts** (DeepSeekMoE, Dai et al., 2024, arXiv:2401.06066, §3.1-3.2):
split each of N experts of width f into m experts of width f/m and route to m·K of them (same
parameters, same FLOPs per token, C(mN, mK) combinations of experts instead of C(N, K)); then
make K_s of them shared (every token runs them): mN − K_s routed experts, mK − K_s chosen
(`fine_grained`).

Pure arithmetic on Python numbers: nothing here imports torch or starts a process.
"""

from __future__ import annotations

import math
from typing import Sequence

from ..arguments import check_int, is_int, is_number

__all__ = ["COUNT_BYTES", "balanced_step_bytes", "cross_node_bytes", "dropped",
           "expert_capacity", "fine_grained", "imbalance", "kept", "padding_rows",
           "rows_per_expert", "skewed_loads", "step_bytes"]

COUNT_BYTES = 8
"""Bytes of one split count exchanged before the tokens (int64)."""


def expert_capacity(tokens: int, num_experts: int, *, top_k: int = 1,
                    capacity_factor: float | None = 1.0) -> int:
    """C = ⌈capacity_factor · top_k · tokens / num_experts⌉ slots per expert for a group of
    `tokens` tokens (module docstring); `capacity_factor=None` gives C = tokens, so nothing is
    dropped (a token chooses an expert at most once)."""
    check_int("expert_capacity", "tokens", tokens, low=0)
    check_int("expert_capacity", "num_experts", num_experts)
    check_int("expert_capacity", "top_k", top_k, high=num_experts,
              hint="choices per token, at most num_experts")
    if capacity_factor is None:
        return tokens
    if not is_number(capacity_factor) or capacity_factor <= 0:
        raise ValueError(f"expert_capacity: capacity_factor must be a number > 0 or None (no "
                         f"limit), got {capacity_factor!r}")
    # Rounded to 9 digits first so that 1.1 · 10 / 11 counts as the 1 it is, not 1.0000000002.
    return math.ceil(round(capacity_factor * top_k * tokens / num_experts, 9))


def _loads(loads: Sequence[float], owner: str) -> list[float]:
    out = list(loads)
    if not out or not all(is_number(v) and v >= 0 for v in out):
        raise ValueError(f"{owner}: loads must be a non-empty sequence of numbers >= 0 (choices "
                         f"per expert), got {loads!r}")
    return out


def kept(loads: Sequence[float], capacity: float) -> list[float]:
    """Choices each expert keeps: min(l_e, C)."""
    return [min(v, capacity) for v in _loads(loads, "kept")]


def dropped(loads: Sequence[float], capacity: float) -> float:
    """Choices dropped by the capacity C: Σ_e max(0, l_e − C)."""
    return sum(max(0, v - capacity) for v in _loads(loads, "dropped"))


def padding_rows(loads: Sequence[float], capacity: float) -> float:
    """Rows of a padded E × C buffer that hold no token: E·C − Σ_e min(l_e, C)."""
    values = _loads(loads, "padding_rows")
    return len(values) * capacity - sum(kept(values, capacity))


def imbalance(loads: Sequence[float]) -> float:
    """max_e l_e / mean_e l_e (1 when balanced; 0 loads give 1)."""
    values = _loads(loads, "imbalance")
    mean = sum(values) / len(values)
    return max(values) / mean if mean > 0 else 1.0


def skewed_loads(tokens: float, num_experts: int, *, top_k: int = 1,
                 imbalance: float = 1.0) -> list[float]:
    """Expected loads when one "hot" expert gets `imbalance` × the mean k·T/E and the other
    E − 1 share the rest equally (a one-parameter model of a skewed router, for the explorer;
    1 <= imbalance <= E)."""
    check_int("skewed_loads", "num_experts", num_experts)
    check_int("skewed_loads", "top_k", top_k, high=num_experts)
    if not is_number(tokens) or tokens < 0:
        raise ValueError(f"skewed_loads: tokens must be a number >= 0, got {tokens!r}")
    if not is_number(imbalance) or not 1 <= imbalance <= num_experts:
        raise ValueError(f"skewed_loads: imbalance must be a number in 1 … num_experts="
                         f"{num_experts} (max load / mean load), got {imbalance!r}")
    mean = top_k * tokens / num_experts
    if num_experts == 1:
        return [mean]
    rest = mean * (num_experts - imbalance) / (num_experts - 1)
    return [mean * imbalance] + [rest] * (num_experts - 1)


def rows_per_expert(loads: Sequence[Sequence[int]], capacities: Sequence[int], *,
                    pad: bool = False) -> list[list[int]]:
    """rows[r][e] that rank r sends to expert e: min(l_re, C_r) kept choices, or C_r slots for
    every expert when the buffer is padded. `loads[r][e]`: rank r's choices of expert e."""
    if len(loads) != len(capacities):
        raise ValueError(f"rows_per_expert: one capacity per rank, got {len(capacities)} for "
                         f"{len(loads)} ranks")
    out = []
    for row, c in zip(loads, capacities):
        check_int("rows_per_expert", "capacity", c, low=0)
        out.append([c] * len(row) if pad else [min(int(v), c) for v in row])
    return out


def step_bytes(rows: Sequence[Sequence[int]], *, hidden: int, elem_bytes: int,
               count_bytes: int = COUNT_BYTES) -> list[dict[str, int]]:
    """Per rank of an ep group, the bytes of one MoE layer's step (module docstring).

    `rows[r][e]`: rows rank r dispatches to expert e (`rows_per_expert`); ep = len(rows) ranks
    hold E/ep experts each. Keys: ``send_rows`` S_r, ``recv_rows`` R_r, ``forward_in`` /
    ``backward_in`` (what r passes in to `all_to_all_single`, the recorder's rule: the counts,
    then S_r·d·b, then R_r·d·b; backward R_r·d·b + S_r·d·b), ``forward_wire`` / ``backward_wire``
    (what leaves r for other ranks: the send/recv variant's recorded bytes, empty pieces not
    sent) and ``step_in``, ``step_wire``."""
    ep = len(rows)
    if ep == 0:
        raise ValueError("step_bytes: rows must hold one row per rank, got none")
    num_experts = len(rows[0])
    if any(len(r) != num_experts for r in rows) or num_experts % ep:
        raise ValueError(f"step_bytes: every rank needs one count per expert and ep={ep} must "
                         f"divide the experts, got rows of lengths {[len(r) for r in rows]}")
    for name, v in (("hidden", hidden), ("elem_bytes", elem_bytes), ("count_bytes", count_bytes)):
        check_int("step_bytes", name, v)
    if not all(is_int(v) and v >= 0 for r in rows for v in r):
        raise ValueError(f"step_bytes: rows must be ints >= 0, got {rows!r}")
    local = num_experts // ep
    row_bytes = hidden * elem_bytes
    out = []
    for r in range(ep):
        mine = range(r * local, (r + 1) * local)
        send = sum(rows[r])
        send_off = send - sum(rows[r][e] for e in mine)
        recv = sum(rows[j][e] for j in range(ep) for e in mine)
        recv_off = recv - sum(rows[r][e] for e in mine)
        counts_in, counts_wire = num_experts * count_bytes, (ep - 1) * local * count_bytes
        fwd_in = counts_in + (send + recv) * row_bytes
        bwd_in = (recv + send) * row_bytes
        fwd_wire = counts_wire + (send_off + recv_off) * row_bytes
        bwd_wire = (recv_off + send_off) * row_bytes
        out.append(dict(send_rows=send, recv_rows=recv, send_off=send_off, recv_off=recv_off,
                        forward_in=fwd_in, backward_in=bwd_in, step_in=fwd_in + bwd_in,
                        forward_wire=fwd_wire, backward_wire=bwd_wire,
                        step_wire=fwd_wire + bwd_wire))
    return out


def balanced_step_bytes(tokens: float, *, hidden: int, top_k: int, ep: int, elem_bytes: int,
                        capacity_factor: float = 1.0) -> float:
    """Bytes one rank sends to other ranks per MoE layer and step when routing is balanced:
    4 · cf·k·T · d·b · (ep − 1)/ep (the dispatch and combine forward, their gradients backward;
    cf = 1: exactly balanced or dropless, cf > 1: padded buffers). Counts left out."""
    check_int("balanced_step_bytes", "ep", ep)
    if not is_number(capacity_factor) or capacity_factor <= 0:
        raise ValueError(f"balanced_step_bytes: capacity_factor must be a number > 0, got "
                         f"{capacity_factor!r}")
    return 4 * capacity_factor * top_k * tokens * hidden * elem_bytes * (ep - 1) / ep


def cross_node_bytes(rows: Sequence[Sequence[int]], *, ranks_per_node: int, hidden: int,
                     elem_bytes: int, count_bytes: int = COUNT_BYTES) -> list[dict[str, int]]:
    """Per rank of an ep group whose ranks sit in nodes of `ranks_per_node` consecutive ranks:
    ``send_rows`` S_r^x (rows to experts on other nodes), ``recv_rows`` R_r^x (rows from other
    nodes' tokens), and ``step`` = counts + 2·(S_r^x + R_r^x)·d·b bytes a step sends to other
    nodes (the isend/irecv exchange, forward and backward; module docstring)."""
    ep = len(rows)
    check_int("cross_node_bytes", "ranks_per_node", ranks_per_node, high=max(ep, 1))
    if ep == 0 or ep % ranks_per_node:
        raise ValueError(f"cross_node_bytes: ranks_per_node={ranks_per_node} must divide the "
                         f"{ep} ranks of the ep group")
    step_bytes(rows, hidden=hidden, elem_bytes=elem_bytes, count_bytes=count_bytes)  # checks
    local = len(rows[0]) // ep
    out = []
    for r in range(ep):
        node = r // ranks_per_node
        away = [j for j in range(ep) if j // ranks_per_node != node]
        send = sum(rows[r][e] for j in away for e in range(j * local, (j + 1) * local))
        recv = sum(rows[j][e] for j in away for e in range(r * local, (r + 1) * local))
        counts = len(away) * local * count_bytes
        out.append(dict(send_rows=send, recv_rows=recv,
                        step=counts + 2 * (send + recv) * hidden * elem_bytes))
    return out


def fine_grained(num_experts: int, top_k: int, d_ff: int, *, segments: int,
                 shared: int = 0) -> dict[str, int]:
    """DeepSeekMoE's fine-grained segmentation and shared-expert isolation (module docstring):
    N experts of width f, top-K, each split into m = `segments` of width f/m, K_s = `shared` of
    them shared. Returns ``routed`` mN − K_s, ``top_k`` mK − K_s, ``d_ff`` f/m, ``shared`` K_s,
    and ``combinations`` C(mN − K_s, mK − K_s), the ways a token can pick its routed experts."""
    for name, v in (("num_experts", num_experts), ("d_ff", d_ff), ("segments", segments)):
        check_int("fine_grained", name, v)
    check_int("fine_grained", "top_k", top_k, high=num_experts)
    check_int("fine_grained", "shared", shared, low=0, high=segments * top_k - 1,
              hint="shared experts, fewer than the m·K experts a token runs")
    if d_ff % segments:
        raise ValueError(f"fine_grained: d_ff={d_ff} cannot be split into {segments} equal "
                         f"experts; choose segments dividing d_ff")
    routed, k = segments * num_experts - shared, segments * top_k - shared
    return dict(routed=routed, top_k=k, d_ff=d_ff // segments, shared=shared,
                combinations=math.comb(routed, k))
