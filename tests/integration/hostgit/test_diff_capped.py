"""`diff_capped` reads a hostile workspace's diff bounded, through the hardened git."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.hostgit import TrustedRepo

pytestmark = pytest.mark.timeout(60)


def test_a_huge_diff_is_cut_at_the_cap(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    repo = TrustedRepo(tmp_path / "git", ws)
    repo.init()
    (ws / "a.txt").write_text("one\n")
    base = repo.commit_all("base")
    # The sandbox writes far more diff than the host will read.
    (ws / "a.txt").write_text("line\n" * 200_000)
    head = repo.commit_all("huge")
    text, cut = repo.diff_capped(base, head, 4096)
    assert cut is True
    assert len(text) == 4096
    assert text.startswith(b"diff --git a/a.txt b/a.txt")
    small, cut = repo.diff_capped(base, head, 10 << 20)
    assert cut is False
    assert small.count(b"\n+line") == 200_000
