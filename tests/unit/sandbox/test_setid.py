"""The host-side setuid/setgid walk on hostile trees (names, links, bounds)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from corral.sandbox.setid import SETID_BITS, strip_setid


def _mode(p: Path | bytes) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def test_clears_bits_on_files_and_directories_keeps_the_rest(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_bytes(b"x")
    (tmp_path / "d" / "f").chmod(0o6755)
    (tmp_path / "d").chmod(0o3775)  # setgid + sticky
    (tmp_path / "plain").write_bytes(b"x")
    (tmp_path / "plain").chmod(0o640)
    tmp_path.chmod(0o2700)
    rep = strip_setid(str(tmp_path))
    assert rep.complete and rep.stripped == 3 and rep.entries == 3
    assert _mode(tmp_path / "d" / "f") == 0o755
    assert _mode(tmp_path / "d") == 0o1775  # sticky stays
    assert _mode(tmp_path / "plain") == 0o640
    assert _mode(tmp_path) == 0o700
    assert set(rep.examples) == {b".", b"d", b"d/f"}


def test_never_follows_a_symlink_out_of_the_tree(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_bytes(b"x")
    (outside / "victim").chmod(0o4755)
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "to_file").symlink_to(outside / "victim")
    (tree / "to_dir").symlink_to(outside)
    rep = strip_setid(str(tree))
    assert rep.complete and rep.stripped == 0
    assert _mode(outside / "victim") == 0o4755


def test_names_are_bytes(tmp_path: Path) -> None:
    name = os.fsencode(tmp_path) + b"/\xff\xfe-\n-bad"
    with open(name, "wb"):
        pass
    os.chmod(name, 0o4700)
    rep = strip_setid(str(tmp_path))
    assert rep.complete and rep.examples == (b"\xff\xfe-\n-bad",)
    assert _mode(name) == 0o700
    assert "examples" in rep.to_detail()


def test_a_single_file_root(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"x")
    f.chmod(0o2755)
    rep = strip_setid(str(f))
    assert rep.complete and rep.stripped == 1 and _mode(f) == 0o755


def test_too_many_entries_is_incomplete(tmp_path: Path) -> None:
    for i in range(20):
        (tmp_path / str(i)).write_bytes(b"")
    rep = strip_setid(str(tmp_path), max_entries=10)
    assert not rep.complete and "more than 10 entries" in rep.problem


def test_too_deep_is_incomplete_and_holds_no_descriptor(tmp_path: Path) -> None:
    p = tmp_path
    for _ in range(12):
        p = p / "d"
        p.mkdir()
    (p / "f").write_bytes(b"")
    (p / "f").chmod(0o4755)
    before = len(os.listdir("/proc/self/fd"))
    rep = strip_setid(str(tmp_path), max_depth=5)
    assert not rep.complete and "deeper than 5" in rep.problem
    assert len(os.listdir("/proc/self/fd")) == before
    full = strip_setid(str(tmp_path))
    assert full.complete and not _mode(p / "f") & SETID_BITS


def test_a_missing_root_is_incomplete_not_an_exception(tmp_path: Path) -> None:
    rep = strip_setid(str(tmp_path / "gone"))
    assert not rep.complete and "gone" in rep.problem
