# Red team 8 (`nan_bubble04`): bubble_fraction returns NaN. The formula judge tested
# `abs(got - want) > 1e-9`, False for NaN, so it passed (4 points with every other function a
# stub). Now the float form refuses NaN before any judge reads it, and the judge itself is
# written `not abs(got - want) <= 1e-9`.


def bubble_fraction(p, m):  # noqa: F811
    return float("nan")
