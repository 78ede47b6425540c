"""One host uid per gVisor sandbox: runsc runs as root of a user namespace corral maps.

Started by host root, runsc runs the sandbox (the sentry and its platform
stubs) as `nobody` of its own namespace, mapped to the host's nobody: every
gVisor sandbox on the host shared uid 65534, and with it the kernel's
per-user quotas (inotify, pipe pages, RLIMIT_NPROC, keyrings), so a sandbox
that escaped its sentry reached the others' processes as their own uid.

As root, corral starts runsc inside a user namespace of its own whose map
sends `nobody` to the sandbox's leased uid (`sandbox.uids`): runsc, still
"root" there, maps nobody to nobody as before, which is now that host uid.
The namespace maps only what runsc's other processes need: root (the
gofer and runsc itself, which open the host files the bundle names, as
today, but hold no capability outside this namespace) and the command's
uid, which the gofer gives files the command creates (turned into the
caller's on disk by the workspace's idmapped mount).
"""

from __future__ import annotations

import ctypes
import os

from corral.errors import SandboxStartError

__all__ = ["enter", "id_map"]

_CLONE_NEWUSER = 0x10000000
_NOBODY = 65534
_libc = ctypes.CDLL(None, use_errno=True)


def id_map(host_id: int, inside_id: int) -> str:
    """The uid (and gid) map of runsc's namespace: root and `inside_id` as on the host,
    nobody as `host_id` (pure)."""
    if host_id in (0, inside_id, _NOBODY) or inside_id in (0, _NOBODY):
        raise ValueError(f"host id {host_id} / inside id {inside_id} would overlap the map")
    return f"0 0 1\n{inside_id} {inside_id} 1\n{_NOBODY} {host_id} 1\n"


def enter(userns_fd: int) -> None:
    """Join the namespace (in the launcher's child, before exec; single-threaded).

    The process keeps host uid 0, which the map shows as root, and gains the
    namespace's full capability set (and none outside it).
    """
    if _libc.setns(userns_fd, _CLONE_NEWUSER) != 0:
        err = ctypes.get_errno()
        raise SandboxStartError(err, f"setns(CLONE_NEWUSER): {os.strerror(err)}")
