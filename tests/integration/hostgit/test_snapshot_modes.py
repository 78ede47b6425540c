"""M13: setuid/setgid bits in a workspace never reach a snapshot."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from corral.hostgit import TrustedRepo


def test_snapshot_carries_no_setid_or_sticky_bits(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "g").mkdir(parents=True)
    (ws / "s").write_bytes(b"#!/bin/sh\n")
    (ws / "s").chmod(0o6755)
    (ws / "g" / "f").write_bytes(b"x")
    (ws / "g").chmod(0o3777)
    repo = TrustedRepo(tmp_path / "git", ws)
    repo.init()
    commit = repo.commit_all("setid")
    snap = tmp_path / "snap"
    repo.snapshot(commit, snap)
    # git records 100644/100755 only, and the tar data filter clears high bits.
    assert stat.S_IMODE(os.lstat(snap / "s").st_mode) == 0o755
    assert not os.lstat(snap / "g").st_mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX)
