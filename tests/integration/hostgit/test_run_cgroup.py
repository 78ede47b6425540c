"""Host git on a workspace is charged to the run: it joins the run's `helpers` cgroup.

Judged by the kernel's own counter of the run cgroup (its peak), never by
sampling: without the join git's pages land in the caller's cgroup and the
run's peak stays at zero.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.errors import CorralError
from corral.hostgit import GitError, TrustedRepo
from corral.run.runcg import RunCgroup

pytestmark = [pytest.mark.requires_root, pytest.mark.requires_cgroup, pytest.mark.timeout(60)]


@pytest.fixture
def run_cg() -> Iterator[RunCgroup]:
    cg = RunCgroup.detect(f"t{secrets.token_hex(4)}")
    assert cg is not None
    cg.create(256 << 20)
    try:
        yield cg
    finally:
        with contextlib.suppress(CorralError, OSError):
            cg.sweep()


def test_commit_and_snapshot_git_is_charged_to_the_run(tmp_path: Path, run_cg: RunCgroup) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "blob").write_bytes(os.urandom(16 << 20))
    repo = TrustedRepo(tmp_path / "git", ws, cgroup_procs=run_cg.helper_procs())
    repo.init()
    sha = repo.commit_all("random")
    repo.snapshot(sha, tmp_path / "snap")
    assert (tmp_path / "snap" / "blob").stat().st_size == 16 << 20
    # git wrote ~16 MiB of objects: their pages are the run's.
    assert run_cg.peak_memory() >= 8 << 20, run_cg.peak_memory()


def test_a_join_that_fails_refuses_to_run_git(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    repo = TrustedRepo(tmp_path / "git", ws, cgroup_procs=(str(tmp_path / "no" / "cgroup.procs"),))
    with pytest.raises(GitError, match="could not join the run cgroup"):
        repo.init()
    assert not (tmp_path / "git" / "HEAD").exists()
