"""A run's directory (state, journal, workspace, reports) is private to its user."""

from __future__ import annotations

import io
import os
import stat
from pathlib import Path

import pytest

from corral.errors import CorralError
from corral.run.coordinator import Coordinator, create_run
from corral.run.mission import load_mission
from corral.run.progress import PlainProgress

from .helpers import new_id, write_mission


def test_run_directory_is_created_0700_whatever_the_umask(tmp_path: Path) -> None:
    mission = load_mission(write_mission(tmp_path / "m"))
    old = os.umask(0o022)
    try:
        layout = create_run(mission, tmp_path / ".corral" / "runs", run_id=new_id())
    finally:
        os.umask(old)
    assert stat.S_IMODE(layout.root.stat().st_mode) == 0o700
    # Everything below (workspace, journal, state) is reached through it.
    assert layout.workspace.parent == layout.root and layout.state.parent == layout.root


def test_the_coordinator_clears_setid_bits_before_it_commits(tmp_path: Path) -> None:
    # An agent sandbox SIGKILLed before its own teardown leaves the workspace
    # unchecked; the coordinator's pre-commit walk is what stands then.
    mission = load_mission(write_mission(tmp_path / "m"))
    layout = create_run(mission, tmp_path / "runs", run_id=new_id())
    coord = Coordinator(layout, PlainProgress(io.StringIO()))
    planted = layout.workspace / "suid"
    planted.write_bytes(b"#!/bin/sh\n")
    planted.chmod(0o4755)
    coord._strip_setid()
    assert stat.S_IMODE(planted.stat().st_mode) == 0o755
    deep = layout.workspace
    for _ in range(300):
        deep = deep / "d"
        deep.mkdir()
    with pytest.raises(CorralError, match="cannot clear setuid/setgid bits"):
        coord._strip_setid()
