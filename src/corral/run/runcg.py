"""The run cgroup: `corral/run-<id>`, one memory cap over every process of the run.

Each sandbox's cgroup is created below it by the namespace backend
(`cgroup_parent="corral/run-<id>"`); the run's brokers are moved into its
`helpers` child, and corral's own per-run helper processes (the synthetic
provider, report rendering, the product-port forwarder, the MCP gateway)
each into a `helpers-<name>` child, so the
kernel counts each apart. On cgroup v1 a parent's memory limit (and memsw) covers its
children (hierarchical accounting is always on in current kernels), so the
kernel's peak counter of the run cgroup (`memory.max_usage_in_bytes`, or
`memory.peak` on v2) is the run's peak, helpers included.

`sweep()` is the recovery step: it kills every process found anywhere in the
run's subtree, in every hierarchy, and removes the cgroups, deepest first.
`freeze()`/`thaw()` pause the whole subtree: the v1 freezer and v2's
`cgroup.freeze` are both hierarchical, and a cgroup created (or a process
attached) below a frozen one is frozen too. A frozen task does not act on
SIGKILL until it is thawed (v1), so `sweep()` signals every process first,
while nothing can fork, and only then thaws: they die without running again.

A run id always starts with a letter, so `run-<id>` never looks like a
per-sandbox cgroup (`<env>-<pid>-<hex>`) to the backend's stale sweep.

A fleet run (leased from the shared store) lives one level deeper, in
`corral/run-<id>/lease-<epoch>`: each lease epoch (the store's fencing
token) has its own subtree, so a driver that stalled past its lease and
wakes up on the host where its successor now runs can only kill and remove
what it started itself. The successor's recovery sweeps the older epochs
(`sweep_older_epochs`), never a newer one.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
from pathlib import Path

from corral.errors import CgroupError
from corral.sandbox.cgroup import Cgroup, CgroupLayout, detect_layout, pid_alive
from corral.sandbox.spec import Limits

__all__ = [
    "HELPER_GROUPS",
    "RunCgroup",
    "ephemeral_run_cgroup",
    "parse_cgroup_key",
    "run_cgroup_path",
]

#: corral's own per-run helper processes, each in `helpers-<name>` (run/helpers.py).
HELPER_GROUPS = ("provider", "report", "forward", "mcp")


_EPOCH = re.compile(r"lease-([1-9][0-9]{0,17})")
_EPHEMERAL = re.compile(r"run-(view|agent)-([1-9][0-9]{0,9})-[0-9a-f]{12}")


def run_cgroup_path(run_id: str, epoch: int | None = None) -> str:
    base = f"corral/run-{run_id}"
    return base if epoch is None else f"{base}/lease-{epoch}"


def parse_cgroup_key(key: str) -> tuple[str, int | None]:
    """(run id, epoch) of a `RUN_ID` or `RUN_ID:EPOCH` key (run ids have no colon; pure)."""
    rid, sep, ep = key.partition(":")
    if not sep:
        return rid, None
    if not ep.isdigit() or int(ep) < 1:
        raise CgroupError(0, f"bad run cgroup key {key[:80]!r}")
    return rid, int(ep)


class RunCgroup:
    """The cgroup subtree of one run (of one lease epoch of it, for a fleet run)."""

    def __init__(self, layout: CgroupLayout, run_id: str, epoch: int | None = None) -> None:
        self.layout = layout
        self.run_id, self.epoch = run_id, epoch
        self.relpath = run_cgroup_path(run_id, epoch)
        self.cgroup = Cgroup(layout, self.relpath)

    @classmethod
    def detect(cls, run_id: str, epoch: int | None = None) -> RunCgroup | None:
        layout = detect_layout()
        return None if layout is None else cls(layout, run_id, epoch)

    @property
    def key(self) -> str:
        """What `parse_cgroup_key` turns back into this cgroup (passed to helpers)."""
        return self.run_id if self.epoch is None else f"{self.run_id}:{self.epoch}"

    def _roots(self) -> list[str]:
        roots = [m for _, m in self.layout.v1]
        if self.layout.unified:
            roots.append(self.layout.unified)
        return list(dict.fromkeys(roots))

    def exists(self) -> bool:
        return any(os.path.isdir(os.path.join(r, self.relpath)) for r in self._roots())

    def descendants(self) -> list[str]:
        """Relative paths of every cgroup below the run's, deepest first."""
        found: set[str] = set()
        for root in self._roots():
            base = Path(root, self.relpath)
            if not base.is_dir():
                continue
            for dirpath, dirnames, _ in os.walk(base):
                for d in dirnames:
                    found.add(os.path.relpath(os.path.join(dirpath, d), root))
        return sorted(found, key=lambda p: (-p.count("/"), p))

    def pids(self) -> set[int]:
        """Every process in the run's subtree."""
        out = set(self.cgroup.pids())
        for rel in self.descendants():
            out |= Cgroup(self.layout, rel).pids()
        return out

    def create(self, memory_cap: int) -> None:
        """Create the run cgroup (with its cap) and its `helpers` child."""
        Cgroup.create(self.layout, self.relpath, Limits(memory_bytes=memory_cap))
        # Their sockets (broker, forwarder, gateway, provider) count against
        # the run's TCP share too, not only their user memory.
        Cgroup.create(self.layout, f"{self.relpath}/helpers", Limits()).account_sockets()
        for name in HELPER_GROUPS:
            Cgroup.create(self.layout, self._helper_rel(name), Limits()).account_sockets()

    def _helper_rel(self, name: str | None) -> str:
        if name is not None and name not in HELPER_GROUPS:
            raise CgroupError(0, f"no helper cgroup named {name!r}")
        return f"{self.relpath}/helpers" if name is None else f"{self.relpath}/helpers-{name}"

    def attach_helper(self, pid: int) -> None:
        Cgroup(self.layout, f"{self.relpath}/helpers").attach_pid(pid)

    def helper_procs(self, name: str | None = None) -> tuple[str, ...]:
        """The `cgroup.procs` files a helper writes itself into (one per hierarchy).

        `name`: one of HELPER_GROUPS (`helpers-<name>`); None is `helpers`.
        """
        helpers = Cgroup(self.layout, self._helper_rel(name))
        return tuple(dict.fromkeys(os.path.join(d, "cgroup.procs") for d in helpers.dirs.values()))

    def helper_peak(self, name: str) -> int:
        """The kernel's peak memory counter of `helpers-<name>` (0 once it is gone)."""
        cg = Cgroup(self.layout, self._helper_rel(name))
        try:
            return cg.usage().peak_memory_bytes
        except (CgroupError, OSError):
            return 0

    def peak_memory(self) -> int:
        return self.cgroup.usage().peak_memory_bytes if self.exists() else 0

    def oom_kills(self) -> int:
        return self.cgroup.usage().oom_kills if self.exists() else 0

    def freeze(self, timeout_s: float = 5.0) -> None:
        """Stop every process of the run where it is (CgroupError if it cannot)."""
        self.cgroup.freeze(timeout_s)

    def thaw(self, timeout_s: float = 5.0) -> None:
        self.cgroup.thaw(timeout_s)

    def kill_and_thaw(self) -> int:
        """SIGKILL every process of the run, then thaw it so they die; the number signalled."""
        pids = self.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.exists():
            with contextlib.suppress(CgroupError):
                self.thaw()
        return len(pids)

    def sweep(self) -> int:
        """Kill every process of the run and remove its cgroups; the number killed."""
        killed = self.kill_and_thaw() if self.exists() else 0
        for rel in self.descendants():
            with contextlib.suppress(CgroupError):
                Cgroup(self.layout, rel).remove(timeout_s=5.0)
        if self.exists():
            self.cgroup.remove(timeout_s=5.0)
        return killed

    def older_epochs(self) -> list[int]:
        """The lease epochs of this run below ours that left a subtree on this host."""
        if self.epoch is None:
            return []
        found: set[int] = set()
        for root in self._roots():
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                for name in os.listdir(os.path.join(root, run_cgroup_path(self.run_id))):
                    m = _EPOCH.fullmatch(name)
                    if m and int(m.group(1)) < self.epoch:
                        found.add(int(m.group(1)))
        return sorted(found)

    def sweep_older_epochs(self) -> int:
        """Takeover on this host: kill and remove every older epoch's subtree (a dead or
        stalled predecessor's sandboxes and brokers), never a newer one; the number killed."""
        killed = 0
        for k in self.older_epochs():
            killed += RunCgroup(self.layout, self.run_id, k).sweep()
        return killed

    def remove_parent(self) -> None:
        """Remove the run's empty `corral/run-<id>` once its last epoch ended (final run)."""
        if self.epoch is None:
            return
        for root in self._roots():
            # Busy or not empty: another epoch is still there; it removes it.
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(root, run_cgroup_path(self.run_id)))


def ephemeral_run_cgroup(kind: str) -> RunCgroup | None:
    """A run cgroup of its own for a `corral view` or `corral agent run` (`kind`),
    named after this process (`run-<kind>-<pid>-<hex>`); None without a hierarchy.

    Its owner removes it on close; one SIGKILLed cannot, so the next owner of
    the same kind first sweeps those whose process is gone (their helpers
    included), as the backend's sweep does for sandboxes.
    """
    if kind not in ("view", "agent"):
        raise ValueError(f"no ephemeral run cgroup kind {kind!r}")
    layout = detect_layout()
    if layout is None:
        return None
    roots = [m for _, m in layout.v1] + ([layout.unified] if layout.unified else [])
    stale: set[str] = set()
    for root in dict.fromkeys(roots):
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            for name in os.listdir(os.path.join(root, "corral")):
                m = _EPHEMERAL.fullmatch(name)
                if m and m.group(1) == kind and not pid_alive(int(m.group(2))):
                    stale.add(name.removeprefix("run-"))
    for rid in sorted(stale):
        # Another owner starting now may sweep the same one.
        with contextlib.suppress(CgroupError, FileNotFoundError):
            RunCgroup(layout, rid).sweep()
    return RunCgroup(layout, f"{kind}-{os.getpid()}-{secrets.token_hex(6)}")
