"""The compiled front end (`_frontend/frontend.c`): built once, cached, installed as `corral`.

`frontend_binary(cache_dir)` compiles the front end for this interpreter and
source tree (their paths and the launcher's build id are compiled in) and
caches it under the same trust rule as the compiled init: a regular file
owned by this user and writable by nobody else, or it is rebuilt.

    python -m corral.exec.frontend install [DEST]   (scripts/install-frontend.sh)

installs it at DEST (default /usr/local/bin/corral as root, else
~/.local/bin/corral), ahead of the Python console script on a usual PATH.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import zlib
from pathlib import Path

from corral.errors import CorralError
from corral.exec import launcher

__all__ = ["FRONTEND_SOURCE", "build", "frontend_binary", "install", "main"]

FRONTEND_SOURCE = str(Path(__file__).resolve().parents[1] / "_frontend" / "frontend.c")
_CFLAGS = ("-O2", "-Wall", "-Wextra", "-D_FORTIFY_SOURCE=2", "-fstack-protector-strong")
#: Static first: no dynamic loader on every `corral exec` (measured -1.4 and -0.5 ms median
#: paired through the launcher); linked dynamically where the C library has no static archive.
_LINKS: tuple[tuple[str, ...], ...] = (("-static",), ())


class FrontendBuildError(CorralError, OSError):
    """The front end could not be compiled or installed."""


def _c_string(text: str) -> str:
    """`text` as a C string literal: every byte outside a safe set in octal."""
    safe = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-+ "
    return '"' + "".join(chr(b) if b in safe else f"\\{b:03o}" for b in os.fsencode(text)) + '"'


def defines(python: str | None = None, src: str | None = None) -> tuple[str, ...]:
    """The configuration compiled into the front end (pure)."""
    return (
        f"-DCORRAL_PYTHON={_c_string(python or sys.executable)}",
        f"-DCORRAL_SRC={_c_string(src or launcher.source_root())}",
        f"-DCORRAL_BUILD_ID={_c_string(launcher.BUILD_ID)}",
        f"-DCORRAL_TAG={_c_string(launcher.tag())}",
    )


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


def build(out: str) -> None:
    """Compile the front end to `out` (atomically); raises FrontendBuildError."""
    import shutil
    import subprocess
    import tempfile

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise FrontendBuildError(0, "no C compiler (cc or gcc) to build the front end")
    directory = os.path.dirname(out) or "."
    fd, tmp = tempfile.mkstemp(prefix=".corral-frontend-", dir=directory)
    os.close(fd)
    try:
        for link in _LINKS:
            proc = subprocess.run(
                [cc, *_CFLAGS, *link, *defines(), "-o", tmp, FRONTEND_SOURCE],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            if proc.returncode == 0:
                break
        else:
            raise FrontendBuildError(0, f"cc failed: {proc.stderr.strip()[-2000:]}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, out)
        tmp = ""
    except (OSError, subprocess.SubprocessError) as exc:
        raise FrontendBuildError(0, f"cannot build the front end: {exc}") from exc
    finally:
        if tmp:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def frontend_binary(cache_dir: str) -> str:
    """The front end for this source and interpreter, built into `cache_dir` when needed."""
    with open(FRONTEND_SOURCE, "rb") as fh:
        source = fh.read()
    key = f"{zlib.crc32(source + ' '.join((*_CFLAGS, *_LINKS[0], *defines())).encode()):08x}"
    path = os.path.join(cache_dir, f"corral-frontend-{key}")
    if _trusted(path):
        return path
    os.makedirs(cache_dir, mode=0o755, exist_ok=True)
    build(path)
    return path


def install(dest: str) -> str:
    """Build (or reuse) the front end and copy it to `dest`; returns `dest`."""
    import shutil

    from corral.sandbox.namespace import cache_dir

    built = frontend_binary(cache_dir())
    directory = os.path.dirname(os.path.abspath(dest))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".corral-frontend-{os.getpid()}")
    shutil.copyfile(built, tmp)
    os.chmod(tmp, 0o755)
    os.replace(tmp, dest)
    return dest


def _default_dest() -> str:
    if os.geteuid() == 0:
        return "/usr/local/bin/corral"
    return os.path.join(os.path.expanduser("~"), ".local", "bin", "corral")


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "install" or len(argv) > 2:
        sys.stderr.write("usage: python -m corral.exec.frontend install [DEST]\n")
        return 2
    dest = argv[1] if len(argv) == 2 else _default_dest()
    try:
        install(dest)
    except (OSError, CorralError) as exc:
        sys.stderr.write(f"corral frontend: {exc}\n")
        return 1
    sys.stdout.write(f"installed the corral front end at {dest} (python: {sys.executable})\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
