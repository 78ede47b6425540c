"""The compiled sandbox init (init.c) and gVisor supervisor (gvsup.c): built once
per machine, cached, verified.

`init_binary(cache_dir)` returns the path of a `corral-init` built from the
init.c shipped with this package, compiling it with the system C compiler on
first use. The cache file is trusted only if it is a regular file owned by
this user and writable by nobody else (the same rule as the seccomp cache);
anything else is rebuilt. Without a compiler it returns None and the
launcher falls back to init.py under /usr/bin/python3 (slower start-up).
`gvsup_binary(cache_dir)` does the same for the gVisor backend's static
supervisor (without it, that backend runs the command with `runsc exec`).
"""

from __future__ import annotations

import os
import stat
import zlib

from corral._payload import path as payload_path

__all__ = ["GVSUP_SOURCE", "INIT_SOURCE", "gvsup_binary", "init_binary"]

INIT_SOURCE = payload_path("init.c")
GVSUP_SOURCE = payload_path("gvsup.c")
_CFLAGS = ("-O2", "-Wall", "-Wextra", "-D_FORTIFY_SOURCE=2", "-fstack-protector-strong")
#: Tried first: a static init skips the dynamic loader (ld.so.cache, libc's
#: mapping and relocations) inside every sandbox, ~0.3-0.5 ms of each start.
#: Where the C library has no static archive the init is linked dynamically.
_INIT_LINKS: tuple[tuple[str, ...], ...] = (("-static",), ())
#: Static only: gVisor's ptrace platform makes every mapping of a dynamic load dear.
_GVSUP_LINKS: tuple[tuple[str, ...], ...] = (("-static", "-s"),)


def _trusted(path: str) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (
        stat.S_ISREG(st.st_mode)
        and st.st_uid == os.geteuid()
        and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        and bool(st.st_mode & stat.S_IXOTH)
    )


def init_binary(cache_dir: str) -> str | None:
    """The compiled init for this source, building it when needed; None without a compiler."""
    return _binary(cache_dir, "corral-init", INIT_SOURCE, _INIT_LINKS)


def gvsup_binary(cache_dir: str) -> str | None:
    """The static gVisor supervisor, building it when needed; None without a compiler
    (or without a static libc)."""
    return _binary(cache_dir, "corral-gvsup", GVSUP_SOURCE, _GVSUP_LINKS)


def _binary(cache_dir: str, name: str, src: str, links: tuple[tuple[str, ...], ...]) -> str | None:
    try:
        with open(src, "rb") as fh:
            source = fh.read()
    except OSError:
        return None
    # The key only tells source versions apart (trust comes from the ownership
    # check); crc32 avoids importing hashlib on every sandbox start.
    flags = " ".join((*_CFLAGS, *links[0])).encode()
    key = f"{zlib.crc32(source + flags):08x}-{len(source)}"
    path = os.path.join(cache_dir, f"{name}-{key}")
    if _trusted(path):
        return path
    return _build(path, cache_dir, src, links, name)


def _build(
    path: str, cache_dir: str, src: str, links: tuple[tuple[str, ...], ...], name: str
) -> str | None:
    import contextlib
    import shutil
    import subprocess
    import tempfile

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    try:
        os.makedirs(cache_dir, mode=0o755, exist_ok=True)
        # The sandbox's unprivileged uid must be able to reach the binary.
        os.chmod(cache_dir, 0o755)
        fd, tmp = tempfile.mkstemp(prefix=f".{name}-", dir=cache_dir)
        os.close(fd)
    except OSError:
        return None
    try:
        for link in links:
            proc = subprocess.run(
                [cc, *_CFLAGS, *link, "-o", tmp, src],
                capture_output=True,
                timeout=120,
                check=False,
            )
            if proc.returncode == 0:
                break
        else:
            return None
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
        tmp = ""
        return path
    except (OSError, subprocess.SubprocessError):
        return None
    finally:
        if tmp:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
