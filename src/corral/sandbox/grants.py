"""Resolve a grant path (workspace, --ro, --rw) without following planted symlinks (M13).

A sandbox can write symlinks into its workspace; a later `--ro WS/docs` or
`--rw WS/link` resolved with realpath() would bind whatever the link points
at (any host directory). So a grant is opened with
openat2(RESOLVE_NO_SYMLINKS): the kernel refuses every symlink on the way,
including the last component, and `..` is resolved on real directories only.

The one exception are the top-level system aliases (`/bin`, `/lib`, `/lib64`,
... -> `usr/...` on merged-/usr hosts): they sit in `/`, which no sandbox can
write (a workspace or grant of `/` is refused), so they are followed once, at
the start of the path. Every other symlink is refused with the component
named; the caller passes the real path instead.

`open_grant` returns an O_PATH descriptor: the staging code clones the mount
from that descriptor (open_tree(fd, "", AT_EMPTY_PATH)), so a swap after the
check cannot redirect the bind.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import struct

from corral.errors import UsageError

__all__ = ["SYSTEM_ALIASES", "GrantSymlinkError", "fd_path", "open_grant", "resolve_grant"]

#: Top-level names that may be symlinks into /usr (the only links followed).
SYSTEM_ALIASES = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")

_SYS_OPENAT2 = 437
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_O_PATH = 0o10000000
_O_CLOEXEC = 0o2000000
_libc = ctypes.CDLL(None, use_errno=True)


class GrantSymlinkError(UsageError):
    """A grant path goes through a symlink that is not a system alias."""


def _openat2_path(dir_fd: int, rel: bytes) -> int:
    """openat2(dir_fd, rel, O_PATH, RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS); raises OSError."""
    how = ctypes.create_string_buffer(
        struct.pack("QQQ", _O_PATH | _O_CLOEXEC, 0, _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS)
    )
    fd = int(_libc.syscall(_SYS_OPENAT2, dir_fd, rel, how, 24))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), os.fsdecode(rel))
    return fd


def _system_alias(first: str) -> str | None:
    """The target of `/first` if it is a root-owned system alias, else None."""
    if first not in SYSTEM_ALIASES:
        return None
    path = f"/{first}"
    try:
        st = os.lstat(path)
        target = os.readlink(path)
    except OSError:
        return None
    if not stat.S_ISLNK(st.st_mode) or st.st_uid != 0:
        return None
    parts = target.strip("/").split("/")
    if not target or ".." in parts:
        return None
    return target.lstrip("/")


def _first_symlink(path: str) -> str | None:
    """The first component of absolute `path` that is a symlink (for the message)."""
    cur = ""
    for part in path.strip("/").split("/"):
        if not part or part == ".":
            continue
        cur = os.path.dirname(cur) if part == ".." else f"{cur}/{part}"
        try:
            if stat.S_ISLNK(os.lstat(cur or "/").st_mode):
                return cur
        except OSError:
            return None
    return None


def open_grant(raw: str, what: str) -> int:
    """An O_PATH descriptor of `raw`, opened without following any non-alias symlink.

    Raises GrantSymlinkError (naming the symlink) or UsageError (missing path).
    """
    path = os.path.join(os.getcwd(), raw) if not raw.startswith("/") else raw
    parts = [p for p in path.split("/") if p]
    if parts:
        alias = _system_alias(parts[0])
        if alias is not None:
            parts = [*alias.split("/"), *parts[1:]]
    rel = "/".join(parts) or "."
    root = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return _openat2_path(root, os.fsencode(rel))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            link = _first_symlink("/" + rel) or path
            raise GrantSymlinkError(
                f"{what} {raw} goes through the symlink {link}, which a sandbox may have "
                "planted; pass the real path"
            ) from None
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise UsageError(f"{what} {raw} does not exist") from None
        if exc.errno == errno.ENOSYS:
            raise UsageError(f"{what} {raw}: this kernel has no openat2 (Linux >= 5.6)") from None
        raise UsageError(f"{what} {raw}: {exc.strerror}") from None
    finally:
        os.close(root)


def fd_path(fd: int) -> str:
    """The absolute path the kernel records for `fd`."""
    return os.readlink(f"/proc/self/fd/{fd}")


def resolve_grant(raw: str, what: str) -> str:
    """The real absolute path of `raw` under the rule of `open_grant` (no planted symlinks)."""
    fd = open_grant(raw, what)
    try:
        return fd_path(fd)
    finally:
        os.close(fd)
