"""Host processes that write a sandbox's files get no share of a disk's reserve.

ext4 lets a write into its reserved blocks when the writer is `s_resuid`, is
in group `s_resgid`, or holds CAP_SYS_RESOURCE. A run's disk image keeps its
reserve for corral's own state and gives it to a group the coordinator joins
(`run/rundisk.py`), so every host process started from the coordinator
inherits that group. The namespace backend's command drops all groups inside
bwrap; but on gVisor the workspace is written by runsc's gofer and on the
microVM by QEMU, host processes whose credentials are the coordinator's unless
dropped. Called in the child between fork and exec (raw calls only): the
supplementary groups go, and CAP_SYS_RESOURCE leaves the bounding set, so a
root exec gets no such capability back.
"""

from __future__ import annotations

import ctypes
import os

__all__ = ["drop_reserve_access"]

_PR_CAPBSET_DROP = 24
_CAP_SYS_RESOURCE = 24
_libc = ctypes.CDLL(None, use_errno=True)


def drop_reserve_access() -> None:
    """As root: no supplementary groups, no CAP_SYS_RESOURCE after exec (no-op otherwise)."""
    if os.geteuid() != 0:
        return
    os.setgroups([])
    if _libc.prctl(_PR_CAPBSET_DROP, _CAP_SYS_RESOURCE, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_CAPBSET_DROP, CAP_SYS_RESOURCE): {os.strerror(err)}")
