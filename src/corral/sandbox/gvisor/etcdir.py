"""The sandbox's /etc as one directory: one OCI mount instead of one per entry.

runsc pays for every mount of the bundle at start-up (the sentry sets up a
gofer-backed mount for each, ~3 ms apiece on the ptrace platform), and /etc
was ~30 of them. As root, corral builds the whole /etc in the bundle
instead: the synthetic passwd/group/hosts as files, each allowlisted host
entry as a read-only bind in the private mount namespace runsc starts in
(host mount syscalls, microseconds each), host symlinks copied as symlinks;
the bundle then binds that one directory on /etc. The binds live in that
namespace only: the host's mount table never shows them, and they vanish
with runsc.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["prepare"]


def prepare(
    etc_dir: str, entries: tuple[str, ...], synthetic: Mapping[str, bytes]
) -> list[tuple[str, str]]:
    """Fill `etc_dir` (new, empty); the (host source, mount point) binds left for the child."""
    binds: list[tuple[str, str]] = []
    for name in entries:
        if name in synthetic:
            continue
        src, dst = os.path.join("/etc", name), os.path.join(etc_dir, name)
        if os.path.islink(src):
            os.symlink(os.readlink(src), dst)
            continue
        if os.path.isdir(src):
            os.mkdir(dst, 0o755)
        elif os.path.exists(src):
            os.close(os.open(dst, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o644))
        else:
            continue
        binds.append((src, dst))
    for name, data in synthetic.items():
        with open(os.path.join(etc_dir, name), "wb") as fh:
            fh.write(data)
    return binds
