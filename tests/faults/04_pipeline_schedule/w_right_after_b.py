# Each W right after its own B: the backward split but never delayed, so nothing fills the
# drain: idle (p − 1)(t_F + t_B) per stage, between 1F1B's and ZB-H1's.


def zb_h1(p, m):
    out = []
    for row in one_f_one_b(p, m):  # the reference's, above
        ops = []
        for op in row:
            ops.append(op)
            if op.startswith("B"):
                ops.append("W" + op[1:])
        out.append(ops)
    return out
