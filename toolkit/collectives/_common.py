"""What every collective here shares: the group seen from this rank, reduce ops, input checks,
and the one point-to-point step they are all built from (chunking: `toolkit.chunks`).

Every byte the algorithms move goes through `dist.isend` / `dist.irecv`, looked up at call time so
that `toolkit.comm` records each message (the sliced ring posts the same calls through
`GroupView.isend` / `irecv`, which skip torch's Python checks and record them the same way).
The only other traffic is the optional agreement check (`agree`), a 48-byte header sent with the
*unrecorded* functions: it is validation, not part of the algorithm, and keeping it out of the
trace keeps the recorded traffic equal to the theory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from ..arguments import is_int

# The tensor_split rule lives in toolkit.chunks (no dependencies); ring.py and all_reduce.py
# take it from here.
from ..chunks import chunk_bounds, chunk_sizes  # noqa: F401
from ..comm import patch
from ..comm.post import post_p2p

ReduceOpLike = Any  # "sum" | "avg" | "product" | "max" | "min" | torch.distributed.ReduceOp

REDUCE_OPS = ("sum", "avg", "product", "max", "min")
_FROM_TORCH = {"SUM": "sum", "AVG": "avg", "PRODUCT": "product", "MAX": "max", "MIN": "min"}


@dataclass(frozen=True)
class GroupView:
    """A process group as one rank sees it: its rank in the group, the size, the global ranks."""

    handle: Any
    """The `ProcessGroup` to pass to torch (None for the default group)."""
    rank: int
    """This process's rank within the group; -1 when it is not a member."""
    ranks: tuple[int, ...]
    """Global rank of each group rank."""

    @property
    def size(self) -> int:
        return len(self.ranks)

    def peer(self, group_rank: int) -> int:
        """Global rank of `group_rank` (torch's p2p calls take global ranks, also in a group)."""
        return self.ranks[group_rank % self.size]

    def isend(self, t: torch.Tensor, group_rank: int) -> Any:
        """``dist.isend(t, self.peer(group_rank), group=self.handle)``, recorded the same, posted
        without torch's per-call Python checks (`toolkit.comm.post.post_p2p`)."""
        group_rank %= self.size
        return post_p2p("isend", t, self.ranks[group_rank], self.handle, group_rank)

    def irecv(self, t: torch.Tensor, group_rank: int) -> Any:
        """``dist.irecv(t, self.peer(group_rank), group=self.handle)``, as `isend`."""
        group_rank %= self.size
        return post_p2p("irecv", t, self.ranks[group_rank], self.handle, group_rank)

    def group_rank(self, global_rank: int, *, name: str, arg: str) -> int:
        """Rank within the group of a global rank given as `arg`; a clear error if outside."""
        if not is_int(global_rank):
            raise TypeError(f"{name}({arg}=...) must be an int (a global rank), "
                            f"got {type(global_rank).__name__}")
        if global_rank not in self.ranks:
            where = "the world" if self.handle is None else f"the group {list(self.ranks)}"
            raise ValueError(f"{name}({arg}={global_rank}): rank {global_rank} is not in {where}; "
                             f"pass the global rank of a member")
        return self.ranks.index(global_rank)


def view(group: Any, name: str) -> GroupView:
    """The `GroupView` of `group` (None: the whole world) for this process."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"{name}() needs a process group: call it inside a rank started by "
                           "toolkit.launch.spawn (or after torch.distributed.init_process_group)")
    if group is None or group is dist.GroupMember.WORLD:
        return GroupView(None, dist.get_rank(), tuple(range(dist.get_world_size())))
    ranks = tuple(dist.get_process_group_ranks(group))
    return GroupView(group, dist.get_rank(group), ranks)


# -- reduce ops ----------------------------------------------------------------------------------

def reduce_op(op: ReduceOpLike, name: str) -> str:
    """Normalise ``"sum"`` / ``dist.ReduceOp.SUM`` / ... to one of `REDUCE_OPS`."""
    if isinstance(op, str):
        key = op.lower()
    else:
        key = _FROM_TORCH.get(str(op).rsplit(".", 1)[-1].upper(), "")
    if key not in REDUCE_OPS:
        raise ValueError(f"{name}(op={op!r}) is not supported; use one of {', '.join(REDUCE_OPS)} "
                         "(or the matching torch.distributed.ReduceOp)")
    return key


def combine(op: str) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """In-place ``acc ← acc ⊕ x`` for a normalised op (avg sums; the caller divides once)."""
    if op in ("sum", "avg"):
        return lambda acc, x: acc.add_(x)
    if op == "product":
        return lambda acc, x: acc.mul_(x)
    if op == "max":
        return lambda acc, x: torch.maximum(acc, x, out=acc)
    return lambda acc, x: torch.minimum(acc, x, out=acc)


def finish_avg(op: str, t: torch.Tensor, size: int) -> None:
    if op == "avg":
        t.div_(size)


# -- input checks --------------------------------------------------------------------------------

def check_tensor(t: Any, name: str, arg: str, op: str | None = None) -> None:
    """Fail before any communication on what this rank alone can tell is wrong."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}({arg}=...) must be a torch.Tensor, got {type(t).__name__}")
    if t.is_sparse:
        raise TypeError(f"{name}({arg}=...) must be a dense tensor, got a sparse one")
    if op == "avg" and not (t.is_floating_point() or t.is_complex()):
        raise TypeError(f"{name}(op='avg') needs a floating-point tensor, got {t.dtype} "
                        f"(integer division would truncate); convert with .float() or use op='sum'")
    if op is not None and t.dtype == torch.bool:
        raise TypeError(f"{name}({arg}=...) is a bool tensor; reduce a numeric dtype instead")


def flat_view(t: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """A 1-D view of `t`'s elements and whether it is a copy that must be written back."""
    if t.is_contiguous():
        return t.view(-1), False
    return t.contiguous().view(-1), True


_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
           torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128]


def _dtype_code(dtype: torch.dtype) -> int:
    return _DTYPES.index(dtype) if dtype in _DTYPES else len(_DTYPES)


def agree(g: GroupView, name: str, *, numel: int, dtype: torch.dtype, device: torch.device,
          op: str = "", root: int = -1) -> None:
    """Check that this rank and its left neighbour called `name` with the same arguments.

    A ring of 48-byte headers (numel, dtype, op, root): if any two ranks differ, some pair of
    neighbours differs and that rank raises, naming both sides, before any payload is sent.
    Uses the unrecorded send/recv (see the module docstring). The header lives on the payload's
    `device` (NCCL moves CUDA tensors only), except on gloo, whose point-to-point moves host
    memory only (ranks sharing a GPU): there it stays on the host.
    """
    if g.size == 1:
        return
    ops = ("",) + REDUCE_OPS
    where = torch.device("cpu") if dist.get_backend(g.handle) == "gloo" else device
    mine = torch.tensor([numel, _dtype_code(dtype), ops.index(op), root, 0, 0], dtype=torch.int64,
                        device=where)
    theirs = torch.empty_like(mine)
    left, right = (g.rank - 1) % g.size, (g.rank + 1) % g.size
    works = [patch.original("isend")(mine, g.peer(right), group=g.handle),
             patch.original("irecv")(theirs, g.peer(left), group=g.handle)]
    for w in works:
        w.wait()
    if torch.equal(mine, theirs):
        return

    def describe(h: torch.Tensor) -> str:
        n, code, o, r = h[:4].tolist()  # one copy to the host, not four
        dt = str(_DTYPES[code]).removeprefix("torch.") if code < len(_DTYPES) else "another dtype"
        text = f"{n} {dt} elements"
        if o:
            text += f", op={ops[o]!r}"
        if r >= 0:
            text += f", root {r}"
        return text

    raise ValueError(
        f"{name}: ranks disagree. Rank {g.peer(g.rank)} passed {describe(mine)}, but rank "
        f"{g.peer(left)} passed {describe(theirs)}. Every rank of the group must call {name} with "
        "tensors of the same size and dtype (and the same op and root).")


# -- the one communication step ------------------------------------------------------------------

def exchange(g: GroupView, *, send: torch.Tensor | None = None, dst: int | None = None,
             recv: torch.Tensor | None = None, src: int | None = None) -> None:
    """Send `send` to group rank `dst` and receive into `recv` from `src`, concurrently.

    Both are posted before either is waited on: a ring in which every rank does a blocking send
    and then a blocking recv deadlocks on gloo (each send waits for its receiver).
    """
    works = []
    if send is not None:
        works.append(dist.isend(send, g.peer(dst), group=g.handle))
    if recv is not None:
        works.append(dist.irecv(recv, g.peer(src), group=g.handle))
    for w in works:
        w.wait()


def send(g: GroupView, t: torch.Tensor, dst: int) -> None:
    exchange(g, send=t, dst=dst)


def recv(g: GroupView, t: torch.Tensor, src: int) -> None:
    exchange(g, recv=t, src=src)


def same_layout(ts: Sequence[torch.Tensor], like: torch.Tensor, name: str, arg: str,
                size: int) -> None:
    """`ts` holds `size` tensors of `like`'s shape and dtype (scatter and gather lists)."""
    if ts is None or len(ts) != size:
        got = "None" if ts is None else f"{len(ts)} tensors"
        raise ValueError(f"{name}({arg}=...) on the root must hold one tensor per rank "
                         f"({size}), got {got}")
    for i, t in enumerate(ts):
        check_tensor(t, name, f"{arg}[{i}]")
        if t.shape != like.shape or t.dtype != like.dtype:
            raise ValueError(f"{name}: {arg}[{i}] is {tuple(t.shape)} {t.dtype} but the tensor "
                             f"is {tuple(like.shape)} {like.dtype}; they must match")
