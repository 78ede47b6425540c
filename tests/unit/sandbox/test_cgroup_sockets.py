"""Socket buffers count against the memory cap (issue 10), against fake hierarchies."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.errors import CgroupError
from corral.sandbox import cgroup
from corral.sandbox.cgroup import Cgroup, CgroupLayout, socket_share
from corral.sandbox.spec import Limits

MIB = 1 << 20


def _fake_v1(tmp_path: Path) -> tuple[CgroupLayout, Path]:
    mounts = []
    for ctrl in ("memory", "pids", "cpu", "freezer"):
        (tmp_path / ctrl).mkdir()
        mounts.append((ctrl, str(tmp_path / ctrl)))
    return CgroupLayout("v1", tuple(sorted(mounts)), None), tmp_path / "memory" / "corral" / "s"


def test_socket_share_is_an_eighth_capped() -> None:
    assert socket_share(64 * MIB) == 8 * MIB
    assert socket_share(4096 * MIB) == 64 * MIB
    for cap in (1 * MIB, 64 * MIB, 3000 * MIB, 1 << 40):
        assert 0 < socket_share(cap) < cap


def test_v1_splits_the_cap_between_user_and_tcp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout, d = _fake_v1(tmp_path)
    monkeypatch.setattr(cgroup, "host_swap_bytes", lambda: 0)
    cg = Cgroup(layout, "corral/s")
    cg._mkdirs()
    for name in ("memory.kmem.tcp.limit_in_bytes", "memory.memsw.limit_in_bytes"):
        (d / name).touch()
    cg._apply_limits(Limits(memory_bytes=64 * MIB))
    user = int((d / "memory.limit_in_bytes").read_text())
    tcp = int((d / "memory.kmem.tcp.limit_in_bytes").read_text())
    assert int((d / "memory.memsw.limit_in_bytes").read_text()) == user
    assert user + tcp == 64 * MIB and tcp == 8 * MIB


def test_v1_without_tcp_accounting_refuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel that cannot charge socket buffers would let them escape the cap."""
    layout, _ = _fake_v1(tmp_path)
    monkeypatch.setattr(cgroup, "host_swap_bytes", lambda: 0)
    with pytest.raises(CgroupError, match="socket buffers"):
        Cgroup.create(layout, "corral/s", Limits(memory_bytes=64 * MIB))


def test_v1_peak_adds_the_tcp_counter(tmp_path: Path) -> None:
    layout, d = _fake_v1(tmp_path)
    d.mkdir(parents=True)
    (d / "memory.max_usage_in_bytes").write_text(f"{5 * MIB}\n")
    (d / "memory.kmem.tcp.max_usage_in_bytes").write_text(f"{8 * MIB}\n")
    (d / "memory.kmem.tcp.usage_in_bytes").write_text(f"{3 * MIB}\n")
    (d / "memory.oom_control").write_text("oom_kill 0\n")
    (d / "memory.failcnt").write_text("0\n")
    cg = Cgroup(layout, "corral/s")
    assert cg.usage().peak_memory_bytes == 13 * MIB
    assert cg.socket_bytes() == 3 * MIB


def _fake_v2(tmp_path: Path) -> tuple[CgroupLayout, Path]:
    root = tmp_path / "unified"
    root.mkdir()
    (root / "cgroup.subtree_control").write_text("memory pids cpu\n")
    (root / "corral").mkdir()
    (root / "corral" / "cgroup.subtree_control").write_text("memory pids cpu\n")
    return CgroupLayout("v2", (), str(root)), root / "corral" / "s"


def test_v2_keeps_the_whole_cap_because_sock_is_in_memory_current(tmp_path: Path) -> None:
    layout, d = _fake_v2(tmp_path)
    cg = Cgroup(layout, "corral/s")
    cg._mkdirs()
    (d / "memory.swap.max").touch()
    cg._apply_limits(Limits(memory_bytes=64 * MIB))
    assert int((d / "memory.max").read_text()) == 64 * MIB
    assert not (d / "memory.kmem.tcp.limit_in_bytes").exists()
    (d / "memory.stat").write_text(f"anon 1000\nfile 0\nsock {7 * MIB}\nshmem 0\n")
    assert cg.socket_bytes() == 7 * MIB


def test_v2_unreadable_stat_is_an_error_not_zero(tmp_path: Path) -> None:
    layout, d = _fake_v2(tmp_path)
    d.mkdir()
    with pytest.raises(CgroupError, match="socket memory"):
        Cgroup(layout, "corral/s").socket_bytes()


def test_v1_helpers_account_sockets_without_a_limit_of_their_own(tmp_path: Path) -> None:
    """v1 charges a socket only if its creator's cgroup had the TCP limit written."""
    layout, d = _fake_v1(tmp_path)
    cg = Cgroup(layout, "corral/s")
    cg._mkdirs()
    cg.account_sockets()
    assert (d / "memory.kmem.tcp.limit_in_bytes").read_text() == "-1"
    assert not (d / "memory.limit_in_bytes").exists()


def test_v2_helpers_need_no_write_to_account_sockets(tmp_path: Path) -> None:
    layout, d = _fake_v2(tmp_path)
    d.mkdir(parents=True)
    before = sorted(p.name for p in d.iterdir())
    Cgroup(layout, "corral/s").account_sockets()
    assert sorted(p.name for p in d.iterdir()) == before
