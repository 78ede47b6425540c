"""Private unix-socket directories and peer checks, shared by every broker socket.

Kept free of heavy imports: `corral exec`'s resident-broker client (resident.py)
uses it on its start path, as do the control server and the resident server.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

from corral.errors import BrokerError

__all__ = ["check_private_dir", "make_private_dirs", "peer_uid", "short_path"]


def check_private_dir(path: Path) -> None:
    """Refuse a directory another uid could enter or replace (BrokerError)."""
    try:
        # O_NOFOLLOW: a symlink planted in place of the directory is refused,
        # and fstat on the opened fd describes what we would really use.
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise BrokerError(f"directory {path}: {exc.strerror}") from exc
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise BrokerError(f"directory {path} must be owned by uid {os.getuid()} with mode 0700")


def make_private_dirs(path: Path) -> None:
    """Create `path` and its missing parents 0700, then `check_private_dir` it and
    the per-user base (`corral-<uid>`) it lies under."""
    missing: list[Path] = []
    p = path
    while not os.path.lexists(p):
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(d, 0o700)
    check_private_dir(path)
    # A per-user base in a shared /tmp could have been made by someone else,
    # who could then swap the directories below it.
    for d in path.parents:
        if d.name == f"corral-{os.getuid()}":
            check_private_dir(d)


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of unix socket `sock` (SO_PEERCRED)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", raw)
    return int(uid)


@contextlib.contextmanager
def short_path(path: Path) -> Iterator[str]:
    """A name for unix socket `path` that fits sun_path, valid inside the block."""
    # sun_path holds 108 bytes and run directories can be deeper: reach the
    # directory through /proc/self/fd, which the kernel resolves at bind/connect.
    if len(os.fsencode(path)) < 100:
        yield str(path)
        return
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)
