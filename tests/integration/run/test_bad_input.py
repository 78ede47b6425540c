"""Bad input: a rejected mission, a product that never becomes ready, a hanging check,
an agent CLI that is not installed. Each ends bounded, with a clear reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.run.store import Store
from tests.integration.run.helpers import corral, env_with, new_id, run_cgroup, write_mission

pytestmark = [pytest.mark.timeout(60)]


def test_malformed_mission_is_rejected_with_its_line(tmp_path: Path) -> None:
    mission = write_mission(tmp_path / "m")
    text = mission.read_text().replace('wall_time = "40s"', 'wall_time = "40s"\nwal_time = 1')
    mission.write_text(text)
    line = next(i for i, t in enumerate(text.splitlines(), 1) if t.startswith("wal_time"))
    proc = corral("run", str(mission), "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert proc.returncode == 2
    assert f"MISSION.md:{line}: unknown key 'session.wal_time'" in proc.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_agent_cli_not_installed(tmp_path: Path) -> None:
    mission = write_mission(tmp_path / "m")
    proc = corral(
        "run",
        str(mission),
        "--agent",
        "codex",
        "--runs-dir",
        str(tmp_path / "runs"),
        cwd=tmp_path,
        env=env_with(CORRAL_TOOLS=str(tmp_path / "no-tools")),
    )
    assert proc.returncode == 2
    assert "agent CLI 'codex' is not installed" in proc.stderr
    assert "scripts/install-agents.sh codex" in proc.stderr


def test_provider_the_agent_cannot_speak_is_refused(tmp_path: Path) -> None:
    mission = write_mission(tmp_path / "m")
    proc = corral(
        "run",
        str(mission),
        "--provider",
        "openai",
        "--runs-dir",
        str(tmp_path / "runs"),
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "script speaks the anthropic API, which openai does not serve" in proc.stderr


@pytest.mark.requires_sandbox
def test_product_that_never_becomes_ready(tmp_path: Path) -> None:
    mission = write_mission(
        tmp_path / "m", max_sessions=1, product_cmd="sleep 100", ready_timeout="2s"
    )
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
        timeout=240,  # bounds a hang only: the verdict is the store's
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    with Store(tmp_path / "runs" / rid / "state.sqlite", readonly=True) as s:
        assert s.run().state == "exhausted"
        [session] = s.sessions()
        served = {c.name: c for c in s.checks(1)}["served"]
    assert session.product_ready is False
    assert not served.passed and served.reason.startswith("product not ready: not ready after 2s")
    assert not run_cgroup(rid).exists()


@pytest.mark.requires_sandbox
def test_hanging_check_is_bounded_by_its_timeout(tmp_path: Path) -> None:
    mission = write_mission(
        tmp_path / "m", max_sessions=1, check_cmd="sleep 100", check_timeout="2s"
    )
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
        timeout=240,  # bounds a hang only: the verdict is the store's
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    with Store(tmp_path / "runs" / rid / "state.sqlite", readonly=True) as s:
        fixed = {c.name: c for c in s.checks(1)}["fixed"]
    assert not fixed.passed and fixed.reason == "timed out after 2s" and fixed.exit == 124
    # Ended by its bound, far from the command's own 100 s on any loaded host.
    assert 2.0 <= fixed.duration_s < 60.0
    assert not run_cgroup(rid).exists()
