"""Fault: imports a package the sandbox does not have. Expected: import_error.
"""

import nonexistent_pkg  # noqa: F401
