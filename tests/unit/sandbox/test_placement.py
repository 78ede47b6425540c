"""State files inside a writable tree are found by inode ancestry, not by string."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.errors import UsageError
from corral.exec.cli import refuse_corral_state, refuse_in_writable
from corral.sandbox.placement import writable_tree_of


def test_direct_and_not_yet_existing(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    assert writable_tree_of(str(ws / "j.sqlite"), [str(ws)]) == str(ws)
    assert writable_tree_of(str(ws / "sub" / "new" / "j.sqlite"), [str(ws)]) == str(ws)
    assert writable_tree_of(str(tmp_path / "j.sqlite"), [str(ws)]) is None
    # A name that merely shares the prefix is not inside.
    (tmp_path / "ws2").mkdir()
    assert writable_tree_of(str(tmp_path / "ws2" / "j"), [str(ws)]) is None


def test_through_a_symlink_and_dotdot(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "d").mkdir(parents=True)
    (tmp_path / "alias").symlink_to(ws)
    assert writable_tree_of(str(tmp_path / "alias" / "j.sqlite"), [str(ws)]) == str(ws)
    dotted = str(tmp_path / "elsewhere" / ".." / "ws" / "d" / "j")
    (tmp_path / "elsewhere").mkdir()
    assert writable_tree_of(dotted, [str(ws)]) == str(ws)
    # A journal file that is itself a symlink into the workspace.
    (tmp_path / "j.sqlite").symlink_to(ws / "d" / "target")
    (ws / "d" / "target").write_bytes(b"")
    assert writable_tree_of(str(tmp_path / "j.sqlite"), [str(ws)]) == str(ws)


def test_refusals_name_the_tree(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    rw = tmp_path / "rw"
    ws.mkdir()
    rw.mkdir()
    with pytest.raises(UsageError, match="inside the workspace"):
        refuse_in_writable(str(ws / "j.sqlite"), "--journal", [str(ws), str(rw)])
    with pytest.raises(UsageError, match=f"inside the writable path {rw}"):
        refuse_in_writable(str(rw / "j.sqlite"), "--journal", [str(ws), str(rw)])
    refuse_in_writable(str(tmp_path / "j.sqlite"), "--journal", [str(ws), str(rw)])


def test_corral_state_in_a_writable_tree_is_refused(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / ".corral" / "runs").mkdir(parents=True)
    with pytest.raises(UsageError, match=r"contains \.corral/runs"):
        refuse_corral_state([str(ws)], cache=str(tmp_path / "cache"))
    run = tmp_path / "run"
    run.mkdir()
    (run / "state.sqlite").write_bytes(b"")
    (run / "run.json").write_bytes(b"{}")
    (run / "git" / "hooks").mkdir(parents=True)
    (run / "workspace" / "src").mkdir(parents=True)
    for inside in (run, run / "git", run / "git" / "hooks"):
        with pytest.raises(UsageError, match="inside the corral run directory"):
            refuse_corral_state([str(inside)], cache=str(tmp_path / "cache"))
    # Its workspace (and anything below) is what sandboxes get anyway.
    refuse_corral_state([str(run / "workspace")], cache=str(tmp_path / "cache"))
    refuse_corral_state([str(run / "workspace" / "src")], cache=str(tmp_path / "cache"))
    (tmp_path / "sibling").mkdir()
    refuse_corral_state([str(tmp_path / "sibling")], cache=str(tmp_path / "cache"))


def test_corral_cache_overlapping_a_writable_tree_is_refused(tmp_path: Path) -> None:
    cache = tmp_path / "var" / "cache" / "corral"
    cache.mkdir(parents=True)
    for tree in (tmp_path / "var", cache, cache / "sub"):
        tree.mkdir(exist_ok=True)
        with pytest.raises(UsageError, match="overlaps corral's cache"):
            refuse_corral_state([str(tmp_path / "ws"), str(tree)], cache=str(cache))
    (tmp_path / "var" / "other").mkdir()
    refuse_corral_state([str(tmp_path / "var" / "other")], cache=str(cache))
