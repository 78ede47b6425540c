"""Grant paths are resolved by the kernel without following planted symlinks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corral.errors import UsageError
from corral.sandbox.grants import GrantSymlinkError, fd_path, open_grant, resolve_grant


def test_a_real_path_resolves_to_itself(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    assert resolve_grant(str(tmp_path / "d"), "--ro path") == str(tmp_path / "d")
    assert resolve_grant(str(tmp_path / "d" / ".." / "d"), "--ro path") == str(tmp_path / "d")


@pytest.mark.parametrize("where", ["last", "middle"])
def test_a_planted_symlink_is_refused_and_named(tmp_path: Path, where: str) -> None:
    secret = tmp_path / "secret"
    (secret / "inner").mkdir(parents=True)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "docs").symlink_to(secret)
    raw = ws / "docs" if where == "last" else ws / "docs" / "inner"
    with pytest.raises(GrantSymlinkError, match=f"symlink {ws / 'docs'},"):
        resolve_grant(str(raw), "--ro path")


def test_a_relative_symlink_and_dotdot_through_it_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "up").symlink_to("../a/b")
    monkeypatch.chdir(tmp_path / "ws")
    with pytest.raises(GrantSymlinkError):
        resolve_grant("up/..", "--rw path")


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        resolve_grant(str(tmp_path / "nope"), "--ro path")


def test_top_level_system_aliases_are_followed() -> None:
    if not os.path.islink("/lib"):
        pytest.skip("this host has no /lib -> usr/lib alias (not merged-/usr)")
    assert resolve_grant("/lib", "--ro path") == os.path.realpath("/lib")


def test_other_system_symlinks_are_refused() -> None:
    if not os.path.islink("/var/run"):
        pytest.skip("this host has no /var/run symlink")
    with pytest.raises(GrantSymlinkError, match="/var/run"):
        resolve_grant("/var/run", "--ro path")


def test_the_descriptor_pins_the_directory_across_a_swap(tmp_path: Path) -> None:
    real = tmp_path / "ws" / "docs"
    real.mkdir(parents=True)
    (real / "mine").write_text("x")
    fd = open_grant(str(real), "--ro path")
    try:
        real.rename(tmp_path / "moved")
        (tmp_path / "ws" / "docs").symlink_to("/etc")
        # The descriptor still names the original directory, not the link's target.
        assert fd_path(fd) == str(tmp_path / "moved")
        assert os.listdir(f"/proc/self/fd/{fd}") == ["mine"]
    finally:
        os.close(fd)
