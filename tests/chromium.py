"""The Chromium the browser tests drive (tests/test_browser.py, tests/test_site.py).

`make browser` installs Debian's package at /usr/bin/chromium; elsewhere (macOS, another
distribution) name yours with ``CHROMIUM=/path/to/chromium make test``: the Makefile and these
tests read the same variable.
"""

from __future__ import annotations

import os
from pathlib import Path

CHROMIUM = Path(os.environ.get("CHROMIUM") or "/usr/bin/chromium")
# Background networking, component updates and sync reach for Google's servers; on a closed
# network they stall or crash the browser. QUIC likewise. Playwright adds a fresh user-data dir.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
MISSING = f"{CHROMIUM} is missing (`make browser` installs it on Debian as root; or set CHROMIUM)"
