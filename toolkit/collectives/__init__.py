"""Collectives built only from point-to-point messages, to see what torch's do underneath.

Every algorithm here moves data with `dist.isend` / `dist.irecv` alone, so `toolkit.comm` records
each message and the traffic can be checked against the theory (see each module's docstring for
its α-β cost; `toolkit.cost` holds the same formulas as functions):

=====================  ==========================================  ============================
collective             algorithms                                  module
=====================  ==========================================  ============================
broadcast              ``linear_broadcast``, ``tree_broadcast``     `rooted`
reduce                 ``linear_reduce``, ``tree_reduce``           `rooted`
all-reduce             ``ps_all_reduce``, ``sharded_ps_all_reduce``,  `all_reduce`, `ring`,
                       ``tree_all_reduce``, ``ring_all_reduce``,      `sliced_ring`
                       ``sliced_ring_all_reduce``
reduce-scatter         ``ring_reduce_scatter``,                    `ring`, `sliced_ring`
                       ``sliced_ring_reduce_scatter``
all-gather             ``ring_all_gather``, ``sliced_ring_all_gather``  `ring`, `sliced_ring`
scatter, gather        ``scatter``, ``gather`` (linear)            `rooted`
=====================  ==========================================  ============================

``broadcast``, ``reduce`` and ``all_reduce`` take ``algorithm=`` to pick one by name. The simple
ring (``"ring"``) teaches and is the reference; the sliced ring (``"sliced_ring"``) is the same ring
run as a pipeline of slices, as NCCL and gloo do, and is the fast one.

Conventions, the same as `torch.distributed` so results can be compared one to one:

* In place: broadcast, reduce (on the root) and all-reduce overwrite their tensor; every function
  also returns the tensor it wrote, for convenience.
* ``group=None`` is the whole world; for a subgroup, roots (``src``, ``dst``, ``root``) are
  *global* ranks, and a rank outside the group returns at once without communicating.
* Any length: chunked algorithms split n elements into p chunks with `chunk_sizes` (the first
  n mod p chunks one element longer), so n need not divide by p; n < p leaves some chunks empty.
* ``op`` is ``"sum"``, ``"avg"``, ``"product"``, ``"max"``, ``"min"`` or a `dist.ReduceOp`.

Bad input fails before anything is sent: a root outside the group, ``op="avg"`` on integers, a
wrong output size. With ``check=True`` (the default) neighbouring ranks also compare a small header
(size, dtype, op, root) first, so ranks passing different sizes raise a `ValueError` naming both
instead of hanging or reading garbage (gloo silently accepts a message shorter than the buffer).
That header is sent with the unrecorded functions; pass ``check=False`` to skip it when timing.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..chunks import chunk_bounds, chunk_sizes  # re-exported: the split every layer shares
from ._common import REDUCE_OPS, GroupView
from .all_reduce import ps_all_reduce, sharded_ps_all_reduce, tree_all_reduce
from .ring import (
    all_gather_chunks, reduce_scatter_chunks, ring_all_gather, ring_all_reduce,
    ring_reduce_scatter,
)
from .sliced_ring import (
    ring_slices, sliced_ring_all_gather, sliced_ring_all_reduce, sliced_ring_reduce_scatter,
)
from .rooted import (
    gather, linear_broadcast, linear_reduce, scatter, tree_broadcast, tree_reduce,
)

ALGORITHMS: dict[str, dict[str, Callable[..., torch.Tensor]]] = {
    "broadcast": {"linear": linear_broadcast, "tree": tree_broadcast},
    "reduce": {"linear": linear_reduce, "tree": tree_reduce},
    "all_reduce": {"ps": ps_all_reduce, "sharded_ps": sharded_ps_all_reduce,
                   "tree": tree_all_reduce, "ring": ring_all_reduce,
                   "sliced_ring": sliced_ring_all_reduce},
    "reduce_scatter": {"ring": ring_reduce_scatter, "sliced_ring": sliced_ring_reduce_scatter},
    "all_gather": {"ring": ring_all_gather, "sliced_ring": sliced_ring_all_gather},
}
"""Every algorithm by collective and short name, e.g. ``ALGORITHMS["all_reduce"]["ring"]``."""


def get_algorithm(collective: str, name: str) -> Callable[..., torch.Tensor]:
    """The function for `collective` and algorithm `name`, or a ValueError listing the choices."""
    if collective not in ALGORITHMS:
        raise ValueError(f"unknown collective {collective!r}; choose from {', '.join(ALGORITHMS)}")
    table = ALGORITHMS[collective]
    if name not in table:
        raise ValueError(f"{collective}(algorithm={name!r}) is not one of {', '.join(table)}")
    return table[name]


def broadcast(tensor: torch.Tensor, src: int, group: Any = None, *, algorithm: str = "tree",
              check: bool = True) -> torch.Tensor:
    """Broadcast `tensor` in place from global rank `src` (``algorithm``: linear | tree)."""
    return get_algorithm("broadcast", algorithm)(tensor, src, group, check=check)


def reduce(tensor: torch.Tensor, dst: int, group: Any = None, *, op: Any = "sum",
           algorithm: str = "tree", check: bool = True) -> torch.Tensor:
    """Reduce `tensor` into global rank `dst` (``algorithm``: linear | tree)."""
    return get_algorithm("reduce", algorithm)(tensor, dst, group, op=op, check=check)


def all_reduce(tensor: torch.Tensor, group: Any = None, *, op: Any = "sum",
               algorithm: str = "ring", check: bool = True) -> torch.Tensor:
    """All-reduce `tensor` in place (``algorithm``: ps | sharded_ps | tree | ring | sliced_ring)."""
    return get_algorithm("all_reduce", algorithm)(tensor, group, op=op, check=check)


__all__ = [
    "ALGORITHMS", "REDUCE_OPS", "GroupView", "get_algorithm", "all_gather_chunks", "all_reduce",
    "broadcast", "chunk_bounds", "chunk_sizes", "gather", "linear_broadcast", "linear_reduce",
    "ps_all_reduce", "reduce", "reduce_scatter_chunks", "ring_all_gather", "ring_all_reduce",
    "ring_reduce_scatter", "ring_slices", "scatter", "sharded_ps_all_reduce",
    "sliced_ring_all_gather", "sliced_ring_all_reduce", "sliced_ring_reduce_scatter",
    "tree_all_reduce", "tree_broadcast", "tree_reduce",
]
