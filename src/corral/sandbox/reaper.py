"""Process-wide state that corral sets once, at its entry points.

`become_subreaper()` makes the calling process the child subreaper
(PR_SET_CHILD_SUBREAPER): orphans of the processes corral starts (the
children of a bwrap monitor or of the egress broker that die before their
own children) are reparented to corral, whose teardown kills and reaps
them, instead of to the host's init, where they would outlive the run. It is
an attribute of the process, not of one sandbox, so it is set by the entry
points that start sandboxes (`corral exec`, `corral run`'s coordinator,
`corral doctor`'s smoke test), never as a side effect of
`NamespaceSandbox.start()`. The verify runner starts no sandbox itself: each
probe is a `corral exec` process, which sets it.
"""

from __future__ import annotations

import ctypes
import os

from corral.errors import SandboxStartError

__all__ = ["become_subreaper", "is_subreaper"]

_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37
_libc = ctypes.CDLL(None, use_errno=True)


def become_subreaper() -> None:
    """Set PR_SET_CHILD_SUBREAPER on the calling process; raises SandboxStartError on failure."""
    if _libc.prctl(_PR_SET_CHILD_SUBREAPER, ctypes.c_ulong(1), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise SandboxStartError(err, f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(err)}")


def is_subreaper() -> bool:
    """Whether the calling process is a child subreaper (PR_GET_CHILD_SUBREAPER)."""
    value = ctypes.c_int(0)
    if _libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(value), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_GET_CHILD_SUBREAPER): {os.strerror(err)}")
    return value.value != 0
