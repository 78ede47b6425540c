"""`cgprime.own_procs_file`: which cgroup.procs the no-op re-attach writes (pure)."""

from __future__ import annotations

from corral.sandbox.cgprime import own_procs_file
from corral.sandbox.cgroup import CgroupLayout

HYBRID = CgroupLayout(
    "v1", (("memory", "/sys/fs/cgroup/memory"), ("pids", "/sys/fs/cgroup/pids")),
    "/sys/fs/cgroup/unified",
)  # fmt: skip
V1 = CgroupLayout("v1", (("pids", "/sys/fs/cgroup/pids"),), None)
SELF = "12:pids:/user.slice/x\n4:memory:/user.slice\n0::/user.slice/session-1.scope\n"


def test_the_unified_hierarchy_first() -> None:
    want = "/sys/fs/cgroup/unified/user.slice/session-1.scope/cgroup.procs"
    assert own_procs_file(HYBRID, SELF) == want


def test_v1_only_uses_the_pids_hierarchy() -> None:
    assert own_procs_file(V1, SELF) == "/sys/fs/cgroup/pids/user.slice/x/cgroup.procs"


def test_root_cgroup_and_nothing_usable() -> None:
    assert own_procs_file(HYBRID, "0::/\n") == "/sys/fs/cgroup/unified/cgroup.procs"
    assert own_procs_file(V1, "0::/\n") is None
    assert own_procs_file(HYBRID, "0::/a/../../etc\n") is None
    assert own_procs_file(HYBRID, "garbage\n") is None
