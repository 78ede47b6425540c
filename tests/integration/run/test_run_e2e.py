"""End to end with the built-in script test agent: both examples pass in two sessions."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from corral.run.store import Store
from tests.integration.run.helpers import EXAMPLES, corral, journal_ok, new_id, run_cgroup

pytestmark = [pytest.mark.requires_sandbox, pytest.mark.timeout(60)]


@pytest.mark.parametrize(("example", "checks"), [("todo-cli", 2), ("todo-api", 3)])
def test_example_passes_in_two_sessions(tmp_path: Path, example: str, checks: int) -> None:
    rid = new_id()
    proc = corral(
        "run",
        str(EXAMPLES / example / "MISSION.md"),
        "--plain",
        "--id",
        rid,
        "--runs-dir",
        str(tmp_path / "runs"),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = tmp_path / "runs" / rid
    with Store(run_dir / "state.sqlite", readonly=True) as store:
        run = store.run()
        s1, s2 = store.sessions()
        first = store.checks(1)
        second = store.checks(2)
    assert run.state == "passed" and run.last_commit == s2.commit_sha
    # Session 1's scenario leaves a check failing; session 2 fixes it.
    assert s1.state == s2.state == "done"
    assert 0 < s1.checks_passed < checks and s2.checks_passed == s2.checks_total == checks
    assert not all(c.passed for c in first) and all(c.passed for c in second)
    assert s1.tokens > 0 and s1.commit_sha != s2.commit_sha
    # The checks ran against the snapshot of each session's commit.
    assert (run_dir / "snapshots" / "session-2").is_dir()
    # ... and the progress said so (issue 14: long work shows progress).
    assert proc.stdout.count("snapshot") >= 2, proc.stdout
    assert 0 < run.peak_memory <= run.memory_cap
    report = (run_dir / "report.md").read_text()
    assert "state: **passed**" in report
    assert f"checks passing after the last session: {checks}/{checks}" in report
    assert "kernel peak" in report
    # The workspace's files are in corral's own repository, outside the workspace.
    assert not (run_dir / "workspace" / ".git").exists()
    assert journal_ok(run_dir / "journal.sqlite")
    conn = sqlite3.connect(run_dir / "journal.sqlite")
    try:
        provider_calls = conn.execute(
            "SELECT COUNT(*) FROM observations WHERE kind='provider_call' AND decision='allow'"
        ).fetchone()[0]
        forwards = conn.execute(
            "SELECT COUNT(*) FROM observations WHERE env='verifier' AND kind='net_connect'"
            " AND rule='product-port'"
        ).fetchone()[0]
    finally:
        conn.close()
    assert provider_calls >= 4
    if example == "todo-api":
        assert s2.product_ready is True
        assert forwards >= 4  # every HTTP check connection went through the forwarder
    # Nothing of the run is left: no process, no cgroup.
    assert not run_cgroup(rid).exists()
    status = corral("status", rid, "--json", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert '"state": "passed"' in status.stdout and f'"checks_passed": {checks}' in status.stdout


def test_agent_cannot_reach_the_checks_or_the_run_state(tmp_path: Path) -> None:
    """The agent sandbox sees the workspace, not the run directory around it (M12)."""
    from tests.integration.run.helpers import write_mission

    mission = write_mission(tmp_path / "m", max_sessions=1)
    scenario = (
        (tmp_path / "m" / "scenario.yaml")
        .read_text()
        .replace(
            "sleep 0; echo one > stage1",
            "ls ../checks ../state.sqlite ../journal.sqlite > probe.txt 2>&1;"
            " echo tamper > ../checks/x 2>>probe.txt; true",
        )
    )
    (tmp_path / "m" / "scenario.yaml").write_text(scenario)
    (tmp_path / "m" / "checks").mkdir()
    (tmp_path / "m" / "checks" / "t.sh").write_text("exit 0\n")
    text = mission.read_text().replace(
        "max_sessions = 1", 'max_sessions = 1\nchecks_dir = "checks"'
    )
    mission.write_text(text)
    rid = new_id()
    proc = corral(
        "run",
        str(mission),
        "--plain",
        "--id",
        rid,
        "--runs-dir",
        str(tmp_path / "runs"),
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    run_dir = tmp_path / "runs" / rid
    probe = (run_dir / "workspace" / "probe.txt").read_text()
    assert "No such file" in probe or "cannot access" in probe
    assert not (run_dir / "checks" / "x").exists()
    assert sorted(p.name for p in (run_dir / "checks").iterdir()) == ["t.sh"]
