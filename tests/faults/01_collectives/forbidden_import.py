"""Fault: imports the toolkit's own collectives. Expected: forbidden_import.
"""

from toolkit.collectives import ring_all_reduce as _theirs  # noqa: F401
