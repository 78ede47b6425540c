"""runsc's release date (it picks the platform), asked once per runsc binary.

`runsc --version` is a Go program start (30-120 ms on a loaded host), and
`corral exec` needed it twice per sandbox (check, then start). The answer
depends only on the binary, so it is kept per binary identity (device,
inode, size, mtime) in corral's cache directory, trusted only as a regular
file owned by this user and writable by nobody else (the rule of the init
and seccomp caches). A wrong entry could only pick a platform the binary
lacks, which runsc then refuses: the sandbox fails to start, never weaker.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import subprocess
import tempfile

__all__ = ["parse_version", "release_date"]

_VERSION_RE = re.compile(rb"runsc version \S*?(\d{8})")
_memo: dict[str, int] = {}


def parse_version(out: bytes) -> int | None:
    """The release date (YYYYMMDD) `runsc --version` names, or None (pure)."""
    m = _VERSION_RE.search(out)
    return int(m.group(1)) if m else None


def _trusted(path: str) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (
        stat.S_ISREG(st.st_mode)
        and st.st_uid == os.geteuid()
        and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def _read(path: str) -> int | None:
    if not _trusted(path):
        return None
    try:
        with open(path, "rb") as fh:
            text = fh.read(16).strip()
    except OSError:
        return None
    return int(text) if len(text) == 8 and text.isdigit() else None


def _write(path: str, date: int) -> None:
    directory = os.path.dirname(path)
    with contextlib.suppress(OSError):
        os.makedirs(directory, mode=0o755, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".runsc-version-", dir=directory)
        try:
            os.write(fd, f"{date}\n".encode())
            os.fchmod(fd, 0o644)
        finally:
            os.close(fd)
        os.replace(tmp, path)


def release_date(runsc: str, cache_dir: str) -> tuple[int | None, str | None]:
    """(date, why not): from the cache when this binary was asked before."""
    try:
        st = os.stat(runsc)
    except OSError as exc:
        return None, f"{runsc} does not run: {exc.strerror}"
    key = f"{st.st_dev:x}-{st.st_ino:x}-{st.st_size:x}-{st.st_mtime_ns:x}"
    if key in _memo:
        return _memo[key], None
    cached = os.path.join(cache_dir, f"runsc-version-{key}")
    date = _read(cached)
    if date is None:
        try:
            out = subprocess.run(
                [runsc, "--version"], capture_output=True, timeout=10, check=False
            ).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            return None, f"{runsc} does not run: {exc}"
        date = parse_version(out)
        if date is None:
            return None, f"{runsc} --version did not name a runsc release"
        _write(cached, date)
    _memo[key] = date
    return date, None
