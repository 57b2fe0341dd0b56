# Seventh red team (issue 30): results whose shapes broadcast. The harness's calls (replaced at
# import) return every gradient and master as a (2²¹, 1, 1) bfloat16 tensor: 4 MB each, well
# within the courier's caps, but the judges subtracted and compared them with (3, 6) and (3,)
# references first and checked shapes after: (2²¹, 3, 6) float64 intermediates, 5.4 GB of grader
# RSS and 36 s for one 4 MB result (the hidden (16, 8) case implies ~40 GB). Now every result is
# checked against the form lab 06 declares before any judge reads it: wrong_result at once, the
# grader bounded.
import _lab_harness  # noqa: E402

_BIG = (1 << 21, 1, 1)


def _big():
    return torch.zeros(_BIG, dtype=torch.bfloat16)


def _unscale(student, call):
    n = len(call.inputs["g"])
    return {"found": False, "grads": [_big() for _ in range(n)],
            "working": [_big() for _ in range(n)]}


def _reduce(student, call):
    return {"grads": [_big() for _ in call.inputs["g"]]}


def _train(student, call):
    c = call.case
    working = [torch.zeros(c["d_out"], c["d_in"], dtype=torch.bfloat16),
               torch.zeros(c["d_out"], dtype=torch.bfloat16)]
    return {"history": [{"stepped": True, "scale": float(c["init_scale"]),
                         "masters": [_big(), torch.zeros(c["d_out"])], "working": working}
                        for _ in range(c["steps"])]}


_lab_harness.CALLS.update(unscale=_unscale, reduce=_reduce, train=_train)
