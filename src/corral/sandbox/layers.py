"""The host facts behind the namespace backend's layers, read in one place.

`NamespaceBackend.check()` (before every start) and `probe` (`corral doctor`)
both decide from these: a sysctl that forbids user namespaces, a cgroup
hierarchy corral cannot write. Cheap file reads only (no subprocess), so the
start path can afford them.
"""

from __future__ import annotations

import os

# Not `typing.TYPE_CHECKING`: importing typing costs ~5 ms on every `corral exec`.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from corral.sandbox.cgroup import CgroupLayout

__all__ = ["cgroup_unwritable", "sysctl", "userns_blocked"]


def sysctl(path: str) -> str | None:
    """A /proc or /sys value, stripped; None when it does not exist or is unreadable."""
    try:
        with open(path, encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return None


def userns_blocked() -> tuple[str, str] | None:
    """(why, fix) when a sysctl or AppArmor forbids unprivileged user namespaces."""
    if sysctl("/proc/sys/user/max_user_namespaces") == "0":
        return "user.max_user_namespaces is 0", "sysctl -w user.max_user_namespaces=10000"
    if sysctl("/proc/sys/kernel/unprivileged_userns_clone") == "0":
        return (
            "kernel.unprivileged_userns_clone is 0",
            "sysctl -w kernel.unprivileged_userns_clone=1",
        )
    if sysctl("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == "1":
        return (
            "AppArmor restricts unprivileged user namespaces",
            "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0 "
            "or add an AppArmor profile for bwrap",
        )
    return None


def cgroup_unwritable(layout: CgroupLayout | None) -> str | None:
    """Why corral cannot create a sandbox cgroup under `layout`, or None when it can.

    On v1 every mounted controller hierarchy must be writable (a sandbox gets
    a directory in each); on v2 the unified root.
    """
    if layout is None:
        return "no cgroup filesystem mounted"
    roots = [m for _, m in layout.v1] or ([layout.unified] if layout.unified else [])
    bad = [r for r in roots if not os.access(r, os.W_OK)]
    if bad:
        return f"cgroup hierarchy {bad[0]} is not writable by uid {os.geteuid()}"
    return None
