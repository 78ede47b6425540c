"""A run's directory (state, journal, workspace, reports) is private to its user."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from corral.run.coordinator import create_run
from corral.run.mission import load_mission

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
