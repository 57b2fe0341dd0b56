"""Words for a launch that stopped moving: a deadlock (the courier saw every rank wait on a call
nobody can complete, or return) or a timeout (some rank was still computing).

The courier knows what each rank waits on (the op, its peer and size) and where in the
student's code it started waiting (the stack the backend sends with each wait); for a rank
that is busy outside any call, the grader asks faulthandler for its stack (SIGUSR1) and finds
the student's line in it.
"""

from __future__ import annotations

from .failures import describe_op, stack_frame, student_frame
from .protocol import Failure


NAMED = 4  # calls named per waiting rank (a rank waits on one, or one per thread)


def _waiting(state, module: str, sources: dict[str, str]) -> str:
    parts = []
    for op_id, stack in state.blocked.items():
        op = state.ops.get(op_id)
        if op is None:
            continue
        if len(parts) == NAMED:
            parts.append(f"rank {state.rank} in {len(state.blocked) - NAMED:,} more calls")
            break
        where = stack_frame(stack, module, sources)
        parts.append(f"rank {state.rank} in {describe_op(op)}" + (f" at {where}" if where else ""))
    return "; ".join(parts)


def deadlock(courier, module: str, sources: dict[str, str]) -> Failure:
    """Every rank still in the launch waits on a call nobody can complete (or has returned)."""
    waits = [w for s in courier.ranks if s.blocked and (w := _waiting(s, module, sources))]
    returned = [s.rank for s in courier.ranks if s.finished]
    gone = [s.rank for s in courier.ranks if s.gone and not s.finished]
    text = "Deadlock: " + "; ".join(waits)
    if returned:
        text += (f"; rank{'s' if len(returned) > 1 else ''} "
                 f"{', '.join(map(str, returned))} had already returned from every call")
    if gone:
        text += f"; rank{'s' if len(gone) > 1 else ''} {', '.join(map(str, gone))} had ended"
    all_sends = all(courier.ranks[s.rank].ops[i].op == "send" for s in courier.ranks
                    for i in s.blocked)
    if all_sends and not returned:
        text += (". Every rank waits in a send for a receive that is never posted: a send "
                 "completes only when its receive is posted, so post isend and irecv before "
                 "waiting on either.")
    else:
        text += (". Every rank must make the same sends, receives and collectives in the same "
                 "order: a rank that skips one or returns early leaves its peers waiting for "
                 "ever.")
    return Failure("deadlock", text, next((s.rank for s in courier.ranks if s.blocked), None))


def timeout(courier, dumps: dict[int, str], limit: float, module: str,
            sources: dict[str, str]) -> Failure:
    """The launch ran past `limit` seconds with some rank outside any communication call;
    `dumps` holds the stack each busy rank printed when asked (SIGUSR1)."""
    waiting = [w for s in courier.ranks if s.blocked and (w := _waiting(s, module, sources))]
    busy = [s for s in courier.ranks if not s.blocked and not s.finished and not s.gone]
    if not busy:
        return deadlock(courier, module, sources)
    places = "; ".join(f"rank {s.rank} at " + (student_frame(dumps.get(s.rank, ""), module,
                                                             sources) or "an unknown place")
                       for s in busy)
    also = (f" The other ranks were waiting for {'it' if len(busy) == 1 else 'them'}: "
            f"{'; '.join(waiting)}." if waiting else "")
    return Failure("timeout", (
        f"Still running after {limit:g} s outside any communication call: an infinite loop or a "
        f"sleep? Where {'it was' if len(busy) == 1 else 'they were'}: {places}.{also}"),
        busy[0].rank)


__all__ = ["deadlock", "timeout"]
