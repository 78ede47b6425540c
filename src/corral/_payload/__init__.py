"""Programs that run INSIDE a sandbox, apart from host code.

Everything in this folder is standard library only and is shipped into a
sandbox as bytes (bound or copied read-only), then run by the sandbox's own
`/usr/bin/python3 -I -S` or compiled (`init.c`). Host code never imports these
modules: it only asks `path()` where one lies, so no sandbox-side helper can
become a host import by accident (`tests/unit/test_import_arrows.py`).
"""

from __future__ import annotations

import os

__all__ = ["DIR", "path"]

DIR = os.path.dirname(os.path.abspath(__file__))


def path(name: str) -> str:
    """The absolute path of the payload file `name` (e.g. "init.c")."""
    return os.path.join(DIR, name)
