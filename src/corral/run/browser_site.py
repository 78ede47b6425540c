"""Where the host's Playwright for Python lies, for browser checks.

A browser check's script imports `playwright` inside the verifier sandbox:
corral binds the site-packages directory holding the host's installed
Playwright (the `browser` extra) read-only there and puts it on the script's
path. Found without importing Playwright (it is heavy and not always there).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

__all__ = ["playwright_site"]


def playwright_site() -> Path | None:
    """The directory that holds the `playwright` package, or None when it is not installed."""
    try:
        spec = importlib.util.find_spec("playwright")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    pkg = Path(spec.origin).resolve().parent
    if not (pkg / "driver").is_dir():
        return None
    return pkg.parent
