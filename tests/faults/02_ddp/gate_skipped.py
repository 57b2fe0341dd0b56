# The gate answered in the rank (1.0) instead of by the grader's courier: backward no longer
# waits for the courier, but the first layer's gradients miss the scale the grade drew, so
# the trained first layer differs from the expected one (the values check fails).
# ruff: noqa: F821 - a fragment appended to ddp.py
import autograder.sandbox.probe as _probe

_probe.Call.gate = lambda call: 1.0
