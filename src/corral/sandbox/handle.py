"""What the handles of process-backed sandboxes share: one host process in a cgroup.

The namespace (bwrap), gVisor (runsc) and microVM (QEMU) handles each own a
`proc` whose whole tree lives in `cgroup`; killing goes through the cgroup
first, because a process that left the tree (setsid, double fork) is still in
the cgroup and is gone only once the cgroup is killed.
"""

from __future__ import annotations

import contextlib

from corral.errors import CgroupError

# Not `typing.TYPE_CHECKING`: importing typing costs ~5 ms on every `corral exec`.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess

    from corral.sandbox.cgroup import Cgroup, CgroupUsage

__all__ = ["CgroupProcessHandle"]


class CgroupProcessHandle:
    """Mixin: `poll`, `usage` and `kill_all` for a handle that sets `proc` and `cgroup`."""

    proc: subprocess.Popen[bytes]
    cgroup: Cgroup | None

    def poll(self) -> int | None:
        return self.proc.poll()

    def usage(self) -> CgroupUsage | None:
        return self.cgroup.usage() if self.cgroup else None

    def kill_all(self) -> None:
        """SIGKILL everything in the sandbox (cgroup kill, then the process itself); idempotent."""
        if self.cgroup is not None:
            with contextlib.suppress(CgroupError):
                self.cgroup.kill()
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
