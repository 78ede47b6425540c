"""M6: corral's git on a workspace never runs what the workspace planted.

The workspace gets a real `.git` with every command-running trap we know of;
each trap would create a marker file on the host if git ran it. Then corral's
host-side git commits, diffs, logs and snapshots the workspace, and the test
checks that no marker exists and the work was still recorded.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from corral.hostgit import TrustedRepo, hardened_env, safe_git


def _trap(script: Path, marker: Path) -> None:
    script.write_text(f"#!/bin/sh\necho ran >> {marker}\ncat\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


@pytest.fixture
def hostile_workspace(tmp_path: Path) -> tuple[Path, Path]:
    ws = tmp_path / "ws"
    ws.mkdir()
    markers = tmp_path / "markers"
    markers.mkdir()
    subprocess.run(["git", "init", "-q", str(ws)], check=True, env=hardened_env(str(tmp_path)))
    traps = tmp_path / "traps"
    traps.mkdir()
    names = [
        "fsmonitor",
        "diffext",
        "clean",
        "smudge",
        "textconv",
        "pager",
        "ssh",
        "hook",
        "askpass",
        "difftool",
    ]
    for name in names:
        _trap(traps / name, markers / name)
    for hook in (
        "pre-commit",
        "post-commit",
        "commit-msg",
        "pre-push",
        "post-checkout",
        "prepare-commit-msg",
        "reference-transaction",
        "post-index-change",
    ):
        _trap(ws / ".git" / "hooks" / hook, markers / f"hook-{hook}")
    with (ws / ".git" / "config").open("a") as fh:
        fh.write(
            f"[core]\n\tfsmonitor = {traps}/fsmonitor\n\tpager = {traps}/pager\n"
            f"\tsshCommand = {traps}/ssh\n\taskPass = {traps}/askpass\n"
            f"\thooksPath = {ws}/.git/hooks\n"
            f"[diff]\n\texternal = {traps}/diffext\n"
            f'[diff "evil"]\n\ttextconv = {traps}/textconv\n\tcommand = {traps}/diffext\n'
            f'[filter "evil"]\n\tclean = {traps}/clean\n\tsmudge = {traps}/smudge\n'
            "\trequired = true\n"
        )
    (ws / ".gitattributes").write_text("* filter=evil diff=evil\n")
    (ws / "nested").mkdir()
    subprocess.run(
        ["git", "init", "-q", str(ws / "nested")], check=True, env=hardened_env(str(tmp_path))
    )
    _trap(ws / "nested" / ".git" / "hooks" / "pre-commit", markers / "nested-hook")
    (ws / "app.py").write_text("print('v1')\n")
    (ws / ".mcp.json").write_text(
        '{"mcpServers": {"x": {"command": "' + str(traps / "hook") + '"}}}\n'
    )
    (ws / ".bashrc").write_text(f"echo ran >> {markers}/bashrc\n")
    (ws / "Makefile").write_text(f"all:\n\techo ran >> {markers}/make\n")
    return ws, markers


def test_no_planted_command_runs(hostile_workspace: tuple[Path, Path], tmp_path: Path) -> None:
    ws, markers = hostile_workspace
    repo = TrustedRepo(tmp_path / "trusted.git", ws)
    repo.init()
    first = repo.commit_all("session 1")
    (ws / "app.py").write_text("print('v2')\n")
    second = repo.commit_all("session 2")
    assert first != second
    stat_out = repo.diff_stat(first, second)
    assert "app.py" in stat_out
    assert [line.split(" ", 1)[1] for line in repo.log()] == ["session 2", "session 1"]
    repo.git("diff", "--no-ext-diff", "--no-textconv", first, second)
    repo.git("status", "--porcelain")
    snap = tmp_path / "snap"
    repo.snapshot(second, snap)
    assert (snap / "app.py").read_text() == "print('v2')\n"
    assert not (snap / ".git").exists()
    assert sorted(os.listdir(markers)) == []


def test_workspace_git_dir_is_not_the_repository(
    hostile_workspace: tuple[Path, Path], tmp_path: Path
) -> None:
    ws, _ = hostile_workspace
    repo = TrustedRepo(tmp_path / "trusted.git", ws)
    repo.init()
    repo.commit_all("one")
    files = repo.git("ls-tree", "-r", "--name-only", "HEAD").decode().split()
    assert "app.py" in files
    assert not any(f.startswith(".git/") for f in files)


def test_traps_are_real(hostile_workspace: tuple[Path, Path], tmp_path: Path) -> None:
    """Without corral's hardening, plain git in the workspace runs the traps (the probe is real)."""
    ws, markers = hostile_workspace
    env = hardened_env(str(tmp_path))
    subprocess.run(["git", "add", "-A"], cwd=ws, env=env, check=False, capture_output=True)
    subprocess.run(["git", "commit", "-qm", "x"], cwd=ws, env=env, check=False, capture_output=True)
    assert os.listdir(markers), "the planted traps never ran even under plain git"


def test_snapshot_refuses_links_out(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "escape").symlink_to("/etc/passwd")
    (ws / "ok.txt").write_text("ok")
    repo = TrustedRepo(tmp_path / "t.git", ws)
    repo.init()
    sha = repo.commit_all("links")
    snap = tmp_path / "snap"
    skipped = repo.snapshot(sha, snap)
    assert skipped == ["escape"]
    assert not (snap / "escape").is_symlink()
    assert (snap / "ok.txt").read_text() == "ok"


def test_safe_git_ignores_caller_git_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    marker = tmp_path / "marker"
    monkeypatch.setenv("GIT_CONFIG_PARAMETERS", f"'core.pager'='touch {marker}'")
    monkeypatch.setenv("GIT_EXTERNAL_DIFF", f"touch {marker}")
    repo = TrustedRepo(tmp_path / "t.git", ws)
    repo.init()
    (ws / "a").write_text("1")
    a = repo.commit_all("a")
    (ws / "a").write_text("2")
    b = repo.commit_all("b")
    safe_git(repo.git_dir, ws, ["diff", a, b])
    safe_git(repo.git_dir, ws, ["log", "-p"])
    assert not marker.exists()


def test_snapshot_of_empty_workspace(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    repo = TrustedRepo(tmp_path / "t.git", ws)
    repo.init()
    sha = repo.commit_all("empty")
    snap = tmp_path / "snap"
    assert repo.snapshot(sha, snap) == []
    assert snap.is_dir() and os.listdir(snap) == []
