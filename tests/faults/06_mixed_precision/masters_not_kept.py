"""Mistake: the "masters" are the working parameters themselves, so the optimizer updates the
16-bit weights. Expected: wrong_result on the masters check, "master weights not kept".
"""


def master_copy(params):
    return list(params)
