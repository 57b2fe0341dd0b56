# The weight gradient of each micro-batch run just before its input gradient: W needs the
# output gradient that B receives, so the validator reports the order.


def zb_h1(p, m):
    out = []
    for row in one_f_one_b(p, m):  # the reference's, above
        ops = []
        for op in row:
            if op.startswith("B"):
                ops.append("W" + op[1:])
            ops.append(op)
        out.append(ops)
    return out
