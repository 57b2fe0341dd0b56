"""Fault: reads the lab's reference solution by absolute path. Expected: sandbox_violation.
"""

from pathlib import Path


import toolkit


_LAB = Path(toolkit.__file__).resolve().parents[1] / "labs" / "01_collectives"


REFERENCE = (_LAB / "collectives.py").read_text()
