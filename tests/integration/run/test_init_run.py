"""`corral init` writes a mission `corral run` accepts; its placeholder check means something."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from corral.run.store import Store
from tests.integration.run.helpers import corral, corral_argv, new_id, run_cgroup

pytestmark = [pytest.mark.requires_sandbox, pytest.mark.timeout(60)]

# Session 1 leaves the workspace empty (the placeholder check fails); session 2 writes a file.
SCENARIO = """name: init
turns: [{say: "nothing scripted"}]
conversations:
  - prompt: "(?m)^Session 1 of"
    turns: [{say: "thinking"}]
  - prompt: "(?m)^Session 2 of"
    turns:
      - calls: [{write_file: {path: notes.py, content: "print('notes')"}}]
      - say: "wrote notes.py"
"""


def test_init_then_run_with_the_script_agent(tmp_path: Path) -> None:
    project = tmp_path / "notes"
    made = subprocess.run(
        corral_argv("init", str(project)),
        input="# Notes\n\nA command-line notes tool.\n",
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    mission = project / "MISSION.md"
    assert f"corral run {mission}" in made.stdout
    assert mission.read_text().rstrip().endswith("A command-line notes tool.")
    again = corral("init", str(project), "--describe", "other", cwd=tmp_path)
    assert again.returncode == 2 and "exists" in again.stderr
    assert "A command-line notes tool." in mission.read_text()

    (project / "scenario.yaml").write_text(SCENARIO)
    rid = new_id()
    runs = tmp_path / "runs"
    proc = corral(
        "run",
        str(mission),
        "--agent",
        "script",
        "--provider",
        "synthetic:scenario.yaml",
        "--plain",
        "--id",
        rid,
        "--runs-dir",
        str(runs),
        cwd=tmp_path,
        timeout=55,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with Store(runs / rid / "state.sqlite", readonly=True) as store:
        assert store.run().state == "passed"
        first, second = store.checks(1), store.checks(2)
    assert [c.passed for c in first] == [False] and [c.passed for c in second] == [True]
    assert not run_cgroup(rid).exists()
