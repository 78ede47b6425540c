"""Which unix-socket connects a sandbox may make (pure; docs/design.md M3).

The supervisor (`unix_supervisor`) resolves a pathname `connect()` the way
the sandbox sees it, pins the inode and asks `admit()`; nothing here does I/O.

A pathname socket is admitted when its inode is bound by a socket of the
sandbox itself (`inside`: listed by the sandbox network namespace's
UNIX_DIAG dump) or when the user granted exactly that inode with
`--allow-unix PATH`. Anything else (a host listener in the workspace or in a
`--ro`/`--rw` tree, another sandbox's socket) is refused with EACCES.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass

__all__ = ["Admission", "UnixConnectEvent", "UnixGrant", "UnixTarget", "admit"]


@dataclass(frozen=True, slots=True)
class UnixGrant:
    """`--allow-unix PATH`: the host socket inode (dev, ino) taken at start."""

    path: str
    dev: int
    ino: int


@dataclass(frozen=True, slots=True)
class UnixTarget:
    """A resolved pathname connect: what the sandbox asked for and what it names.

    `path` is the address as the sandbox wrote it (hostile text, for the
    journal only); `dev`/`ino` identify the inode the supervisor pinned.
    """

    path: str
    dev: int
    ino: int
    is_socket: bool


@dataclass(frozen=True, slots=True)
class Admission:
    """The decision on one connect; `error` is the errno returned on denial."""

    allow: bool
    rule: str
    reason: str
    error: int = 0


def admit(target: UnixTarget, grants: tuple[UnixGrant, ...], inside: bool) -> Admission:
    """Allow a connect to `target` only to the sandbox's own sockets or a granted inode."""
    if not target.is_socket:
        # What the kernel answers for a connect to a non-socket inode.
        return Admission(False, "not-a-socket", "the path is not a socket", errno.ECONNREFUSED)
    for g in grants:
        if (g.dev, g.ino) == (target.dev, target.ino):
            return Admission(True, f"allow-unix {g.path}", "granted with --allow-unix")
    if inside:
        return Admission(True, "inside", "the listener belongs to this sandbox")
    return Admission(
        False,
        "host-socket",
        "the listener is outside this sandbox (host or another sandbox)",
        errno.EACCES,
    )


@dataclass(frozen=True, slots=True)
class UnixConnectEvent:
    """One decided pathname connect, for the journal (`path` is sandbox text)."""

    pid: int
    path: str
    allow: bool
    rule: str
    reason: str
    error: int
