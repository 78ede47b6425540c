"""`CgroupLayout.without_v2_stand_ins`: which v1 hierarchies a hybrid host's sandbox skips."""

from __future__ import annotations

import pytest

from corral.sandbox import cgroup
from corral.sandbox.cgroup import Cgroup, CgroupLayout

V1 = (
    ("cpu", "/c/cpu"), ("cpuacct", "/c/cpuacct"), ("freezer", "/c/freezer"),
    ("memory", "/c/memory"), ("pids", "/c/pids"),
)  # fmt: skip


def test_hybrid_drops_cpuacct_and_freezer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cgroup, "_kernel", lambda: (6, 18))
    slim = CgroupLayout("v1", V1, "/c/unified").without_v2_stand_ins()
    assert [c for c, _ in slim.v1] == ["cpu", "memory", "pids"]
    # The limits' hierarchies and the unified tree (kill, freeze, cpu.stat) stay.
    assert set(Cgroup(slim, "corral/exec-1-ab").dirs) == {"cpu", "memory", "pids", "unified"}


def test_comounted_cpu_cpuacct_keeps_its_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cgroup, "_kernel", lambda: (6, 18))
    both = (("cpu", "/c/cpu,cpuacct"), ("cpuacct", "/c/cpu,cpuacct"), ("pids", "/c/pids"))
    slim = CgroupLayout("v1", both, "/c/unified").without_v2_stand_ins()
    assert slim.v1 == (("cpu", "/c/cpu,cpuacct"), ("pids", "/c/pids"))


@pytest.mark.parametrize(
    ("layout", "kernel"),
    [
        (CgroupLayout("v1", V1, None), (6, 18)),  # no cgroup2 tree: v1 does it all
        (CgroupLayout("v1", V1, "/c/unified"), (5, 13)),  # no cgroup.kill yet
        (CgroupLayout("v2", (), "/c"), (6, 18)),
    ],
)
def test_unchanged_without_a_stand_in(
    layout: CgroupLayout, kernel: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cgroup, "_kernel", lambda: kernel)
    assert layout.without_v2_stand_ins() == layout
