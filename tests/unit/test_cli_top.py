"""The top-level command line: --version and -h."""

from __future__ import annotations

import subprocess
import sys

from corral import __version__


def _corral(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "corral", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_version() -> None:
    out = _corral("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"corral {__version__}"


def test_short_help_everywhere() -> None:
    for args in (("-h",), ("status", "-h"), ("run", "-h"), ("exec", "-h")):
        out = _corral(*args)
        assert out.returncode == 0, (args, out.stderr)
        assert "usage" in out.stdout.lower(), args
