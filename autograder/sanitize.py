"""Text that came from a rank, made safe to print: no escape sequence reaches a terminal.

A rank controls its output, its exception messages and its tracebacks, and the report quotes
them. An OSC or CSI sequence (``ESC ] ... BEL``, ``ESC [ ... m``) printed raw in an
instructor's terminal can retitle the window, rewrite what is on screen, or (in some terminals)
do worse. `printable` keeps newlines and tabs and writes every other control character (C0,
DEL, C1, and the bidirectional overrides that reorder what is shown) as a visible ``\\xNN`` /
``\\uNNNN`` escape.
"""

from __future__ import annotations

import re

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """`text` with every control character but newline and tab shown as an escape."""
    return _CONTROL.sub(_escape, str(text))


__all__ = ["printable"]
