"""Every schedule the toolkit builds, by name: `make_schedule("zb-h1", p=4, m=8)`.

==============  ==========================================  ===================================
name            paper                                        module
==============  ==========================================  ===================================
naive           model parallel, one batch                    `schedules.naive`
gpipe           Huang et al., NeurIPS 2019                   `schedules.gpipe`
1f1b            Narayanan et al., ICML 2021 (PipeDream-Flush) `schedules.one_f_one_b`
interleaved     Narayanan et al., SC 2021, section 2.2.2     `schedules.interleaved`
zb-h1           Qi et al., ICLR 2024, section 2.1            `zero_bubble.zb_h1`
zb-v            Qi et al., arXiv:2401.10241 (ZB-V)           `v_shape.zb_v`
chimera         Li & Hoefler, SC 2021, section 3.1           `bidirectional.chimera`
dualpipe        DeepSeek-V3 report, section 3.2.1            `dualpipe.dualpipe`
terapipe        Li et al., ICML 2021, section 3              `terapipe.terapipe`
==============  ==========================================  ===================================

For terapipe, m is the number of token slices of the sequence; for dualpipe, the micro-batches
of both directions together.
"""

from __future__ import annotations

from .bidirectional import chimera
from .dualpipe import dualpipe
from .schedules import Schedule, gpipe, interleaved, naive, one_f_one_b
from .terapipe import terapipe
from .v_shape import zb_v
from .zero_bubble import zb_h1

NAMES = ("naive", "gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "chimera", "dualpipe",
         "terapipe")
"""Schedule names `make_schedule` knows."""
CLASSIC = NAMES[:4]
"""The schedules of lesson 10 (one backward op, one pipeline over the batch)."""


def key(name: str) -> str:
    """The canonical spelling of a schedule name: ``"ZB_H1"`` → ``"zb-h1"``."""
    bare = str(name).lower().replace("-", "").replace("_", "")
    return {"zbh1": "zb-h1", "zbv": "zb-v"}.get(bare, bare)


def make_schedule(name: str, *, p: int, m: int = 1, v: int = 1) -> Schedule:
    """The schedule called `name` (one of `NAMES`) for p stages, m micro-batches, v chunks."""
    k = key(name)
    if k not in NAMES:
        raise ValueError(f"make_schedule: unknown schedule {name!r}; choose one of {NAMES}")
    if k != "interleaved" and v != 1:
        raise ValueError(f"make_schedule: v (chunks per rank) = {v} needs the 'interleaved' "
                         f"schedule; {name!r} fixes its chunks itself, pass v=1")
    if k == "naive":
        if m != 1:
            raise ValueError(f"make_schedule: naive model parallel runs the whole batch as one "
                             f"micro-batch; pass m=1 (got m={m}), or use 'gpipe' to split it")
        return naive(p)
    build = {"gpipe": gpipe, "1f1b": one_f_one_b, "zb-h1": zb_h1, "zb-v": zb_v,
             "chimera": chimera, "dualpipe": dualpipe, "terapipe": terapipe}
    if k in build:
        return build[k](p, m)
    return interleaved(p, m, v)


__all__ = ["CLASSIC", "NAMES", "key", "make_schedule"]
