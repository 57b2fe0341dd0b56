"""Fault: replaces torch.distributed.isend/irecv with the unrecorded originals. Expected:
tampering.
"""

import torch.distributed.distributed_c10d as c10d


for _name in ("isend", "irecv"):
    _fn = getattr(dist, _name)
    _orig = getattr(_fn, "__wrapped__", _fn)
    setattr(dist, _name, _orig)
    setattr(c10d, _name, _orig)
