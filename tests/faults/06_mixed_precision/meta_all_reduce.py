"""Not a stub: an all-reduce of a tensor on the meta device, for which torch itself raises
NotImplementedError (red team 3, fuzz06/meta: it was reported as "Not written yet ... still
raises NotImplementedError"). Expected: exception on the all-reduce check, torch's
NotImplementedError named as an exception of the rank, not as a stub.
"""

_reference_all_reduce = all_reduce_gradients


def all_reduce_gradients(params):  # noqa: F811
    dist.all_reduce(torch.ones(3, device="meta"))
    return _reference_all_reduce(params)
