"""The gate: a courier round trip whose answer a rank's computation needs, so that when it was
asked is a fact the courier saw, not the rank's word.

The n-th gate a rank asks for in a case (n = 0, 1, ...) is answered with the scale

    s_n = 1 + k_n / 64,   k_n = 1 + (HMAC-SHA256(key, "gate:n")[0] mod 32)  ∈ {1, ..., 32}

where `key` is the case's gate key: `case_key(secret, check, index)`, an HMAC of the grade's
secret (RFC 2104), so s_n depends on the grade, the case and n, never on the rank. Each s_n is
exactly representable in float32 and bfloat16 (six fraction bits), in [1 + 1/64, 1.5], never 1:
a gradient multiplied by it in float32 stays as exact as the gradient itself, and one that
skipped it differs by 1.6 % at least.

The grader puts the key in each case's plan (`CasePlan.gate`, never sent to a rank) and in the
case the judges see (``case["gate_key"]``); the courier answers ``gate`` frames with it
(`courier_frames`). Where there is no grader's courier (a harness called with a `Call` that
has no channel), the public `LOCAL_KEY` gives a fixed schedule that the judges' references use
too when a case carries no key. Read by ranks (`probe`) and the grader alike; holds no secret.
"""

from __future__ import annotations

import hashlib
import hmac

LOCAL_KEY = "local"
"""The key of the public schedule used where no grader's courier answers (no secret)."""
STEPS = 64   # s_n = 1 + k/STEPS: six fraction bits, exact in float32 and bfloat16
SPAN = 32    # k in 1..SPAN: s_n in [1 + 1/64, 1.5]


def case_key(secret: int, check: int, index: int) -> str:
    """The gate key of case `index` of check `check` in the grade whose secret is `secret`
    (hex text: it travels in a case's parameters on the grader's side)."""
    for name, value in (("secret", secret), ("check", check), ("index", index)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"case_key: {name} must be an integer >= 0, got {value!r}")
    mac = hmac.new(secret.to_bytes((secret.bit_length() + 7) // 8 or 1, "little"),
                   f"gate-key:{check}:{index}".encode(), hashlib.sha256)
    return mac.hexdigest()[:32]


def scale(key: str, n: int) -> float:
    """s_n of the gate whose key is `key` (see the module docstring): the n-th answer."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"scale: key must be non-empty text, got {key!r}")
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"scale: n must be an integer >= 0 (the gate's index), got {n!r}")
    digest = hmac.new(key.encode(), f"gate:{n}".encode(), hashlib.sha256).digest()
    return 1.0 + (1 + digest[0] % SPAN) / STEPS


__all__ = ["LOCAL_KEY", "case_key", "scale"]
