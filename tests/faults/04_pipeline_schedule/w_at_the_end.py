# Every W after the stage's last B: valid, but each stage holds all m micro-batches' W inputs
# at once (more than 1F1B holds), and the W fill no gap: idle (p − 1)(t_F + t_B) per stage.


def zb_h1(p, m):
    return [row + [f"W{j}" for j in range(m)]
            for row in one_f_one_b(p, m)]  # the reference's, above
