from __future__ import annotations

from pathlib import Path

import pytest

from corral.errors import CgroupError
from corral.sandbox import cgroup
from corral.sandbox.cgroup import Cgroup, CgroupLayout, detect_layout, parse_flat_keyed
from corral.sandbox.spec import Limits

HYBRID = """\
25 20 0:22 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
26 25 0:23 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
27 25 0:24 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
28 25 0:25 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
29 25 0:26 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
30 25 0:27 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
31 25 0:28 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
32 25 0:29 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""

PURE_V2 = "25 20 0:22 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"

COMOUNT = "26 25 0:23 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"


def test_detect_hybrid() -> None:
    layout = detect_layout(HYBRID)
    assert layout is not None
    assert layout.kind == "v1"
    assert layout.v1_mount("memory") == "/sys/fs/cgroup/memory"
    assert layout.unified == "/sys/fs/cgroup/unified"
    assert layout.v1_mount("systemd") is None


def test_detect_pure_v2() -> None:
    layout = detect_layout(PURE_V2)
    assert layout == CgroupLayout("v2", (), "/sys/fs/cgroup")


def test_detect_none() -> None:
    assert detect_layout("") is None


def test_comounted_controllers_share_one_directory() -> None:
    layout = detect_layout(COMOUNT)
    assert layout is not None
    cg = Cgroup(layout, "corral/exec-1-ab")
    assert cg.dirs["cpu"] == cg.dirs["cpuacct"] == "/sys/fs/cgroup/cpu,cpuacct/corral/exec-1-ab"
    assert cg._unique_dirs() == ["/sys/fs/cgroup/cpu,cpuacct/corral/exec-1-ab"]


def test_cgroup_paths_v1() -> None:
    layout = detect_layout(HYBRID)
    assert layout is not None
    cg = Cgroup(layout, "/corral/run-1-aa/agent/")
    assert cg.relpath == "corral/run-1-aa/agent"
    assert cg.dirs["unified"] == "/sys/fs/cgroup/unified/corral/run-1-aa/agent"
    assert set(cg.dirs) == {"cpu", "cpuacct", "memory", "freezer", "pids", "unified"}


def test_parse_flat_keyed() -> None:
    text = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\nbogus\n"
    assert parse_flat_keyed(text) == {"oom_kill_disable": 0, "under_oom": 0, "oom_kill": 3}


def _fake_v1(tmp_path: Path) -> CgroupLayout:
    mounts = []
    for ctrl in ("memory", "pids", "cpu", "freezer"):
        (tmp_path / ctrl).mkdir()
        mounts.append((ctrl, str(tmp_path / ctrl)))
    return CgroupLayout("v1", tuple(sorted(mounts)), None)


def test_memory_limit_without_swap_accounting_fails_closed_when_host_swaps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No memsw file + host swap: the limit could be escaped through swap, so refuse."""
    layout = _fake_v1(tmp_path)
    monkeypatch.setattr(cgroup, "host_swap_bytes", lambda: 1 << 30)
    with pytest.raises(CgroupError, match="cannot include swap"):
        Cgroup.create(layout, "corral/exec-1-aa", Limits(memory_bytes=256 << 20))


def test_memory_limit_without_swap_accounting_is_fine_without_swap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = _fake_v1(tmp_path)
    monkeypatch.setattr(cgroup, "host_swap_bytes", lambda: 0)
    cg = Cgroup(layout, "corral/exec-1-bb")
    cg._mkdirs()
    (tmp_path / "memory" / "corral" / "exec-1-bb" / "memory.kmem.tcp.limit_in_bytes").touch()
    cg._apply_limits(Limits(memory_bytes=256 << 20))
    limit = tmp_path / "memory" / "corral" / "exec-1-bb" / "memory.limit_in_bytes"
    assert limit.read_text() == str(224 << 20)


def test_sweep_survives_a_stale_cgroup_removed_by_another_corral(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two corrals starting at once sweep the same stale cgroup: the loser reads a
    removed cgroup's files (ENODEV); its start must not fail on that."""
    import errno

    (tmp_path / "corral" / "exec-999999999-ab").mkdir(parents=True)
    layout = CgroupLayout("v2", (), str(tmp_path))

    def gone(self: Cgroup, timeout_s: float = 10.0) -> None:
        raise OSError(errno.ENODEV, "No such device")

    monkeypatch.setattr(Cgroup, "remove", gone)
    monkeypatch.setattr(cgroup, "pid_alive", lambda _pid: False)
    assert cgroup.sweep_stale(layout, "corral") == []

    def broken(self: Cgroup, timeout_s: float = 10.0) -> None:
        raise OSError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(Cgroup, "remove", broken)
    with pytest.raises(PermissionError):
        cgroup.sweep_stale(layout, "corral")
