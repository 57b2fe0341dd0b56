"""The messages between pipeline stages: who sends what to whom under which tag, and a rank's
mailbox that posts receives ahead and sends without blocking.

A micro-batch's path has V = `Schedule.depth` positions (loop layout: virtual stage k = chunk c
of rank r, k = c·p + r; bidirectional: its pipeline's p stages, `Schedule.place`). Each
micro-batch passes one activation forward (k → k+1) and one gradient backward (k → k−1) per
step of its path; W ops (weight gradients) send nothing. Each message has its own tag,

    tag = (mb · V + sender) · 2 + backward

so it can only land in the buffer meant for it, whatever order the ranks post in. An op's input
is received into a buffer posted one op ahead and waited on just before the op runs (the only
place a stage blocks, as Megatron-LM does); sends are ``isend`` and are waited on once, at the
end of the step. Between chunks of one rank (p = 1) the tensor is handed over in memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from .schedules import Op, Schedule


def tag(mb: int, virtual: int, n_virtual: int, backward: bool) -> int:
    """A message's own tag: who sends it (virtual stage), for which micro-batch, which way."""
    return (mb * n_virtual + virtual) * 2 + int(backward)


@dataclass(frozen=True)
class Route:
    """One message as seen by one end: the other rank and the tag."""

    peer: int
    """The rank it comes from (incoming) or goes to (outgoing)."""
    tag: int


class Routes:
    """Where rank `rank`'s ops of `schedule` get their input from and send their output to."""

    def __init__(self, schedule: Schedule, rank: int) -> None:
        self.schedule, self.rank = schedule, rank
        self.n_virtual = schedule.depth

    def virtual(self, op: Op) -> int:
        return self.schedule.virtual_stage(self.rank, op.chunk)

    def _rank(self, op: Op, k: int) -> int:
        return self.schedule.place(k, op.chunk)[0]

    def incoming(self, op: Op) -> Route | None:
        """F(mb) on k > 0 waits for k−1's activation; B(mb) on k < V−1 for k+1's gradient."""
        k = self.virtual(op)
        if op.kind == "F" and k > 0:
            return Route(self._rank(op, k - 1), tag(op.mb, k - 1, self.n_virtual, False))
        if op.kind == "B" and k < self.n_virtual - 1:
            return Route(self._rank(op, k + 1), tag(op.mb, k + 1, self.n_virtual, True))
        return None

    def outgoing(self, op: Op) -> Route | None:
        """F(mb) on k < V−1 sends its output to k+1; B(mb) on k > 0 its input's gradient to k−1."""
        k = self.virtual(op)
        if op.kind == "F" and k < self.n_virtual - 1:
            return Route(self._rank(op, k + 1), tag(op.mb, k, self.n_virtual, False))
        if op.kind == "B" and k > 0:
            return Route(self._rank(op, k - 1), tag(op.mb, k, self.n_virtual, True))
        return None


def sent_messages(schedule: Schedule) -> list[int]:
    """Per stage, the messages it sends to other stages in one step (activations and input
    gradients; W sends nothing, and a hand-over between chunks of one rank is no message)."""
    out = []
    for r, ops in enumerate(schedule.stages):
        routes = Routes(schedule, r)
        out.append(sum(1 for op in ops if (route := routes.outgoing(op)) is not None
                       and route.peer != r))
    return out


@dataclass
class _Posted:
    """A receive posted ahead: a message in flight (`work` into `buffer`), or one this rank
    sent itself (`local`: the tag to take from the in-memory box)."""

    work: dist.Work | None = None
    buffer: Tensor | None = None
    local: int | None = None


class Mailbox:
    """One rank's messages for one step: receives posted ahead, sends that never block."""

    def __init__(self, rank: int, device: torch.device | str = "cpu") -> None:
        self.rank = rank
        self.device = torch.device(device)  # where receive buffers go: the stage's data
        self.posted: dict[int, _Posted | None] = {}   # op index -> its receive (None: no input)
        self.local: dict[int, Tensor] = {}            # tag -> tensor this rank sent itself
        self.sends: list[tuple[dist.Work, Tensor]] = []  # in flight, with the tensor they read

    def post(self, i: int, route: Route | None, shape: torch.Size | None = None,
             dtype: torch.dtype | None = None) -> None:
        """Post the receive of op i's input (no-op when already posted). Posting the next op's
        receive before computing this one lets the message land meanwhile."""
        if i in self.posted:
            return
        if route is None:
            self.posted[i] = None
        elif route.peer == self.rank:
            self.posted[i] = _Posted(local=route.tag)
        else:
            buf = torch.empty(shape, dtype=dtype, device=self.device)
            self.posted[i] = _Posted(dist.irecv(buf, src=route.peer, tag=route.tag), buf)

    def receive(self, i: int) -> Tensor | None:
        """Op i's input, waiting for it if it is still in flight (None: the op has none)."""
        posted = self.posted.pop(i)
        if posted is None:
            return None
        if posted.local is not None:      # the tensor never left this rank
            return self.local.pop(posted.local)
        posted.work.wait()                # the only place a rank blocks
        return posted.buffer

    def send(self, t: Tensor, route: Route) -> None:
        if route.peer == self.rank:
            self.local[route.tag] = t
        else:
            self.sends.append((dist.isend(t, dst=route.peer, tag=route.tag), t))

    def finish(self) -> None:
        """Wait for every send; afterwards nothing of this step is in flight."""
        for work, _ in self.sends:
            work.wait()
        self.sends.clear()
        assert not self.posted and not self.local, "a message was posted but never used"


def swap(t: Tensor, peer: int, *, numel: int) -> Tensor:
    """Send `t` to `peer` and receive `numel` elements from it (same dtype and device), both at
    once, so two ranks swapping never wait on each other."""
    got = torch.empty(numel, dtype=t.dtype, device=t.device)
    works = [dist.isend(t.contiguous(), dst=peer), dist.irecv(got, src=peer)]
    for work in works:
        work.wait()
    return got


__all__ = ["Mailbox", "Route", "Routes", "sent_messages", "swap", "tag"]
