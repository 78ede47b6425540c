"""Run the real `corral` CLI on a pseudo-terminal of a given size (test helper)."""

from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Mapping, Sequence

__all__ = ["plain", "run_in_pty", "run_piped"]

_SGR = re.compile(r"\x1b\[[0-9;]*m")


def _env(extra: Mapping[str, str] | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "FORCE_COLOR")}
    env["TERM"] = "xterm-256color"
    env.update(extra or {})
    return env


def run_in_pty(
    args: Sequence[str],
    columns: int,
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    timeout: float = 60.0,
) -> tuple[int, str]:
    """`python -m corral ARGS` with stdout/stderr on a `columns`-wide pty: (rc, output)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "corral", *args],
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
        env=_env(env),
        cwd=cwd,
    )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            assert time.monotonic() < deadline, b"".join(chunks)[-2000:]
            ready, _, _ = select.select([master], [], [], 0.5)
            if not ready:
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every slave end is closed
                break
            if not data:
                break
            chunks.append(data)
        rc = proc.wait(timeout)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return rc, b"".join(chunks).decode("utf-8", "replace").replace("\r\n", "\n")


def run_piped(
    args: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m corral ARGS` with stdout and stderr on pipes."""
    return subprocess.run(
        [sys.executable, "-m", "corral", *args],
        capture_output=True,
        text=True,
        env=_env(env),
        cwd=cwd,
        timeout=60,
        check=False,
    )


def plain(out: str) -> str:
    """Output without rich's SGR styling."""
    return _SGR.sub("", out)
