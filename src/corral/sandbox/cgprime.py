"""Start the kernel's cgroup-migration grace period early (a latency hint; host code).

Moving a process between cgroups takes the global cgroup_threadgroup_rwsem
for writing; the first writer after a quiet spell waits for an RCU grace
period (`rcu_sync_enter`), writers that follow within about a grace period do
not. Measured on a 2-core cgroup-v1 host: the sandbox child's first
`cgroup.procs` write, between fork and exec, took 5-22 ms; the five after it
0.02 ms each. `start` has a thread move this process into the cgroup it is
already in (a no-op migration) while the rest of the start-up runs, so the
child's own attach finds the grace period already under way or past.

Nothing depends on it: every failure (no permission, a cgroup v2 parent
with controllers enabled, no cgroup mounted) is ignored, and the process
ends where it was, in its own cgroup. The one path it writes is read
from /proc/self/cgroup just before.
"""

from __future__ import annotations

import contextlib
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    import threading

    from corral.sandbox.cgroup import CgroupLayout

__all__ = ["own_procs_file", "start"]


def own_procs_file(layout: CgroupLayout, self_cgroup: str) -> str | None:
    """The cgroup.procs of the cgroup this process is in (pure; `self_cgroup` is /proc/self/cgroup).

    The unified hierarchy when it is mounted, else the v1 pids hierarchy.
    """
    for line in self_cgroup.splitlines():
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if not path.startswith("/") or "\0" in path or "/.." in path:
            continue
        if hid == "0" and controllers == "" and layout.unified:
            return os.path.join(layout.unified, path.lstrip("/"), "cgroup.procs")
        if layout.unified is None and "pids" in controllers.split(","):
            mount = layout.v1_mount("pids")
            if mount is not None:
                return os.path.join(mount, path.lstrip("/"), "cgroup.procs")
    return None


def _reattach(path: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, str(os.getpid()).encode())
        finally:
            os.close(fd)


def start(layout: CgroupLayout) -> threading.Thread | None:
    """Begin the no-op re-attach in a daemon thread; join it once the child has attached."""
    try:
        with open("/proc/self/cgroup", encoding="utf-8", errors="replace") as fh:
            path = own_procs_file(layout, fh.read(65536))
    except OSError:
        return None
    if path is None:
        return None
    import threading

    thread = threading.Thread(target=_reattach, args=(path,), name="corral-cgprime", daemon=True)
    thread.start()
    return thread
